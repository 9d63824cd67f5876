package treemove

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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

// A directory merged onto itself, directly or through a symlink, changes
// nothing: its empty directories stay.
func TestMoveOntoItselfChangesNothing(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "dir")
	build(t, dir, "empty/", "full/", "full/f=f")
	build(t, root, "link -> dir")
	want := describe(t, root)
	for _, dst := range []string{dir, filepath.Join(root, "link"), dir + "/"} {
		if err := Move(dir, dst); err != nil {
			t.Errorf("Move(%s, %s): %v", dir, dst, err)
		}
		if got := describe(t, root); got != want {
			t.Fatalf("after Move(%s, %s):\n%s\nwant\n%s", dir, dst, got, want)
		}
	}
}

// A directory merged into one inside itself is refused before anything
// moves, as rename refuses it; so is one merged into a directory that
// holds it, when one of its entries would land on it. One that holds no
// such entry is merged.
func TestMoveRefusesNestedDirectories(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "p")
	build(t, p, "a/", "a/f=a", "q/", "q/q/", "q/q/f=qq")
	want := describe(t, root)
	if err := Move(p, filepath.Join(p, "q")); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("into a directory inside itself: %v, want EINVAL", err)
	}
	if got := describe(t, root); got != want {
		t.Fatalf("after the refusal:\n%s\nwant\n%s", got, want)
	}
	d := filepath.Join(root, "d")
	build(t, d, "s/", "s/s/", "s/s/inner=inner", "s/x=x")
	want = describe(t, root)
	if err := Move(filepath.Join(d, "s"), d); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("into its parent, holding an entry of its own name: %v, want EINVAL", err)
	}
	if got := describe(t, root); got != want {
		t.Fatalf("after the refusals:\n%s\nwant\n%s", got, want)
	}
	build(t, d, "t/", "t/y=y")
	if err := Move(filepath.Join(d, "t"), d); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(d, "y")); string(got) != "y" {
		t.Errorf("merged into its parent: %q, %v", got, err)
	}
}

// Entries bound for another filesystem are copied whole, with their
// modes, times and symlinks, and their sources removed.
func TestMoveAcrossFilesystems(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	dst, err := os.MkdirTemp("/dev/shm", "treemove-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dst) })
	build(t, src, "sub/", "sub/f=new", "sub/link -> f", "top=top", "old/", "old/g=g")
	build(t, dst, "top=old", "old/", "old/kept=kept")
	var a, b syscall.Stat_t
	if syscall.Stat(src, &a) != nil || syscall.Stat(dst, &b) != nil || a.Dev == b.Dev {
		t.Skip("the temporary directory and /dev/shm share a filesystem")
	}
	if err := os.Chmod(filepath.Join(src, "sub", "f"), 0o751); err != nil {
		t.Fatal(err)
	}
	when := time.Unix(981173106, 0)
	if err := os.Chtimes(filepath.Join(src, "sub", "f"), when, when); err != nil {
		t.Fatal(err)
	}
	if err := Move(src, dst); err != nil {
		t.Fatal(err)
	}
	if got, want := describe(t, dst), "old/\nold/g=g\nold/kept=kept\nsub/\nsub/f=new\nsub/link -> f\ntop=top"; got != want {
		t.Errorf("after the move:\n%s\nwant\n%s", got, want)
	}
	st, err := os.Stat(filepath.Join(dst, "sub", "f"))
	if err != nil || st.Mode().Perm() != 0o751 || !st.ModTime().Equal(when) {
		t.Errorf("the copied file: %v, %v", st, err)
	}
	if entries, _ := os.ReadDir(dst); len(entries) != 3 {
		t.Errorf("%s holds %d entries, want 3 (no temporary left)", dst, len(entries))
	}
	if _, err := os.Lstat(src); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the source is still there: %v", err)
	}
}
