package treemove

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// build makes the entries of spec under dir: "name/" a directory,
// "name -> target" a symlink, "name=data" a file.
func build(t *testing.T, dir string, spec ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range spec {
		var err error
		switch {
		case strings.HasSuffix(s, "/"):
			err = os.MkdirAll(filepath.Join(dir, s), 0o755)
		case strings.Contains(s, " -> "):
			name, target, _ := strings.Cut(s, " -> ")
			err = os.Symlink(target, filepath.Join(dir, name))
		default:
			name, data, _ := strings.Cut(s, "=")
			err = os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// describe lists the tree at dir as build's spec, in walk order.
func describe(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.IsDir():
			lines = append(lines, rel+"/")
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			lines = append(lines, rel+" -> "+target)
		default:
			data, _ := os.ReadFile(p)
			lines = append(lines, rel+"="+string(data))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

func TestMoveRenamesToANewName(t *testing.T) {
	root := t.TempDir()
	src, dst := filepath.Join(root, "src"), filepath.Join(root, "dst")
	build(t, src, "a/", "a/b=new", "f=file")
	if err := Move(src, dst); err != nil {
		t.Fatal(err)
	}
	if got, want := describe(t, root), "dst/\ndst/a/\ndst/a/b=new\ndst/f=file"; got != want {
		t.Errorf("after the move:\n%s\nwant\n%s", got, want)
	}
}

func TestMoveMergesIntoADirectory(t *testing.T) {
	root := t.TempDir()
	src, dst, elsewhere := filepath.Join(root, "src"), filepath.Join(root, "dst"), filepath.Join(root, "elsewhere")
	build(t, elsewhere, "kept=elsewhere")
	build(t, dst, "a/", "a/b=old", "a/mine=mine", "f=old", "link -> ../elsewhere", "only=dst")
	build(t, src, "a/", "a/b=new", "a/c/", "a/c/d=new", "f=new", "link=a file now", "new/", "new/x=new")
	if err := Move(src, dst); err != nil {
		t.Fatal(err)
	}
	want := "dst/\ndst/a/\ndst/a/b=new\ndst/a/c/\ndst/a/c/d=new\ndst/a/mine=mine\ndst/f=new\ndst/link=a file now\n" +
		"dst/new/\ndst/new/x=new\ndst/only=dst\nelsewhere/\nelsewhere/kept=elsewhere"
	if got := describe(t, root); got != want {
		t.Errorf("after the merge:\n%s\nwant\n%s", got, want)
	}
}

// A directory of the copy where dst holds a symlink to a directory is not
// merged through the link: the move fails there, before which entries
// moved and after which they stay in src.
func TestMoveDoesNotMergeThroughSymlinks(t *testing.T) {
	root := t.TempDir()
	src, dst, elsewhere := filepath.Join(root, "src"), filepath.Join(root, "dst"), filepath.Join(root, "elsewhere")
	build(t, elsewhere, "kept=elsewhere")
	build(t, dst, "b -> ../elsewhere")
	build(t, src, "a=first", "b/", "b/x=new", "c=last")
	err := Move(src, dst)
	if !errors.Is(err, syscall.ENOTDIR) || !strings.Contains(err.Error(), filepath.Join(dst, "b")) {
		t.Fatalf("moving a directory onto a symlink: %v, want ENOTDIR naming it", err)
	}
	want := "dst/\ndst/a=first\ndst/b -> ../elsewhere\nelsewhere/\nelsewhere/kept=elsewhere\nsrc/\nsrc/b/\nsrc/b/x=new\nsrc/c=last"
	if got := describe(t, root); got != want {
		t.Errorf("after the failed merge:\n%s\nwant\n%s", got, want)
	}
}

// The top of dst is followed when it is a symlink to a directory, as a
// copy into a link to a directory copies into the directory.
func TestMoveMergesIntoALinkedDirectory(t *testing.T) {
	root := t.TempDir()
	src, dst := filepath.Join(root, "src"), filepath.Join(root, "dst")
	build(t, root, "real/", "real/old=old", "dst -> real")
	build(t, src, "new=new")
	if err := Move(src, dst); err != nil {
		t.Fatal(err)
	}
	if got, want := describe(t, root), "dst -> real\nreal/\nreal/new=new\nreal/old=old"; got != want {
		t.Errorf("after the merge:\n%s\nwant\n%s", got, want)
	}
}

func TestMoveOfAFileOntoADirectoryFails(t *testing.T) {
	root := t.TempDir()
	src, dst := filepath.Join(root, "src"), filepath.Join(root, "dst")
	build(t, dst, "a/", "a/kept=old")
	build(t, src, "a=a file")
	if err := Move(src, dst); !errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("a file onto a directory: %v, want EISDIR", err)
	}
	if got, want := describe(t, root), "dst/\ndst/a/\ndst/a/kept=old\nsrc/\nsrc/a=a file"; got != want {
		t.Errorf("after the failed merge:\n%s\nwant\n%s", got, want)
	}
}
