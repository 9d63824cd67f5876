package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// makeTree builds, under dir, a tree with a nested directory, an empty
// directory, files of several modes and a relative symlink.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []struct {
		name string
		mode fs.FileMode
	}{{"nested/deeper", 0o755}, {"empty", 0o700}} {
		if err := os.MkdirAll(filepath.Join(dir, d.name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, d.name), d.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		name, data string
		mode       fs.FileMode
	}{
		{"top.txt", "top\n", 0o644},
		{"run.sh", "#!/bin/sh\necho hi\n", 0o755},
		{"nested/secret", "s3cret", 0o600},
		{"nested/deeper/big", strings.Repeat("0123456789", 100_000), 0o640},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.data), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, f.name), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../top.txt", filepath.Join(dir, "nested", "link")); err != nil {
		t.Fatal(err)
	}
}

// describeTree lists a local tree as lines "path mode [size|-> target]".
func describeTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		b.WriteString(rel + " " + info.Mode().String())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			b.WriteString(" -> " + target)
		case info.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			b.WriteString(" " + string(data[:min(len(data), 20)]))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestCpRecursiveRoundTrip copies a tree into a Workspace and back out:
// contents, modes, the empty directory and the symlink survive both ways,
// as the guest sees them too, and a tree copied into an existing
// directory lands inside it.
func TestCpRecursiveRoundTrip(t *testing.T) {
	e, id := newDataEnv(t)
	src := filepath.Join(t.TempDir(), "proj")
	makeTree(t, src)
	when := time.Unix(981173106, 0) // 2001-02-03 04:05:06 UTC
	for _, name := range []string{"top.txt", "nested/deeper/big", "nested/deeper", "nested", "empty", "."} {
		if err := os.Chtimes(filepath.Join(src, name), when, when); err != nil {
			t.Fatal(err)
		}
	}
	want := describeTree(t, src)

	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", src, id+":/work/proj"); err != nil {
		t.Fatalf("cp -r up: %v\n%s", err, stderr)
	}
	got := e.sh(t, id, `cd /work/proj && for p in . empty nested nested/deeper nested/link nested/secret run.sh top.txt; do
		stat -c '%n %A' "$p"; done; readlink nested/link; cat nested/link; wc -c < nested/deeper/big`)
	wantGuest := ". drwxr-xr-x\nempty drwx------\nnested drwxr-xr-x\nnested/deeper drwxr-xr-x\nnested/link lrwxrwxrwx\n" +
		"nested/secret -rw-------\nrun.sh -rwxr-xr-x\ntop.txt -rw-r--r--\n../top.txt\ntop\n1000000\n"
	if got != wantGuest {
		t.Errorf("in the guest:\n%s\nwant\n%s", got, wantGuest)
	}
	// Modification times: of files, and of directories, which the files
	// made in them do not move.
	if got := e.sh(t, id, `cd /work/proj && stat -c '%n %Y' . empty nested nested/deeper top.txt nested/deeper/big`); got !=
		". 981173106\nempty 981173106\nnested 981173106\nnested/deeper 981173106\ntop.txt 981173106\nnested/deeper/big 981173106\n" {
		t.Errorf("modification times in the guest:\n%s", got)
	}

	// Out again: DST does not exist, so it becomes the copy.
	back := filepath.Join(t.TempDir(), "back")
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/work/proj", back); err != nil {
		t.Fatalf("cp -r down: %v\n%s", err, stderr)
	}
	if got := describeTree(t, back); got != want {
		t.Errorf("round trip:\n%s\nwant\n%s", got, want)
	}
	// Into an existing directory: the copy lands inside it, under its name.
	into := t.TempDir()
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/work/proj", into); err != nil {
		t.Fatalf("cp -r into a directory: %v\n%s", err, stderr)
	}
	if got := describeTree(t, filepath.Join(into, "proj")); got != want {
		t.Errorf("into a directory:\n%s\nwant\n%s", got, want)
	}
	// Again, over the first copy: merged, changed files replaced, local
	// additions kept.
	e.sh(t, id, "echo changed > /work/proj/nested/secret")
	if err := os.WriteFile(filepath.Join(into, "proj", "nested", "mine"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/work/proj", into); err != nil {
		t.Fatalf("cp -r over an earlier copy: %v\n%s", err, stderr)
	}
	for name, want := range map[string]string{"nested/secret": "changed\n", "nested/mine": "mine", "top.txt": "top\n"} {
		if got, _ := os.ReadFile(filepath.Join(into, "proj", name)); string(got) != want {
			t.Errorf("after the merge, %s = %q, want %q", name, got, want)
		}
	}
	if entries, _ := os.ReadDir(into); len(entries) != 1 {
		t.Errorf("%s holds %v, want proj alone (no temporary left)", into, entries)
	}
	e.sh(t, id, "printf s3cret > /work/proj/nested/secret")
	// A trailing slash on a new DST changes nothing; -r of a file copies the file.
	slash := filepath.Join(t.TempDir(), "slash")
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/work/proj", slash+"/"); err != nil {
		t.Fatalf("cp -r to DST/: %v\n%s", err, stderr)
	}
	if got := describeTree(t, slash); got != want {
		t.Errorf("to DST/:\n%s\nwant\n%s", got, want)
	}
	file := filepath.Join(t.TempDir(), "top.txt")
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/work/proj/top.txt", file); err != nil {
		t.Fatalf("cp -r of a file: %v\n%s", err, stderr)
	}
	if got, _ := os.ReadFile(file); string(got) != "top\n" {
		t.Errorf("cp -r of a file: %q", got)
	}
	// Into an existing remote directory, likewise.
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", src, id+":/work/proj"); err != nil {
		t.Fatalf("cp -r up into a directory: %v\n%s", err, stderr)
	}
	if got := e.sh(t, id, "cat /work/proj/proj/nested/secret"); got != "s3cret" {
		t.Errorf("into a remote directory: %q", got)
	}
}

// TestCpRecursiveUploadIsAllOrNothing: an upload cut short, failed
// midway or stopped by what the destination holds changes nothing there
// that it had not moved whole, and leaves no staging directory behind.
func TestCpRecursiveUploadIsAllOrNothing(t *testing.T) {
	e, id := newDataEnv(t)
	src := filepath.Join(t.TempDir(), "dest")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.sh(t, id, "mkdir -p /work/dest/sub && echo old > /work/dest/a && echo mine > /work/dest/mine")
	const unchanged = "a\nmine\nsub\n--\nold\n--\ndest\n"
	state := func() string {
		return e.sh(t, id, "ls -1A /work/dest; echo --; cat /work/dest/a; echo --; ls -1A /work")
	}

	// Cut: interrupted once the guest's tar has extracted the whole
	// stream (a tar ahead of busybox's on PATH says so, then waits).
	e.sh(t, id, `mkdir -p /usr/local/bin && printf '#!/bin/sh\n/bin/tar "$@"; touch /tmp/extracted; exec sleep 60\n' >/usr/local/bin/tar && chmod +x /usr/local/bin/tar`)
	ctx, interrupt := context.WithCancel(t.Context())
	defer interrupt()
	done := make(chan error, 1)
	go func() {
		_, _, err := e.runIn(ctx, t, "", "ws", "cp", "--addr", e.addr, "--token", e.token, "-r", src, id+":/work")
		done <- err
	}()
	for deadline := time.Now().Add(time.Minute); e.sh(t, id, "[ -e /tmp/extracted ] && echo yes; true") != "yes\n"; {
		if time.Now().After(deadline) {
			t.Fatal("the guest's tar did not extract the upload in a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	interrupt()
	if err := <-done; err == nil || strings.Contains(err.Error(), "left in") {
		t.Fatalf("the interrupted upload: %v, want it to fail with its staging removed", err)
	}
	e.sh(t, id, "rm /usr/local/bin/tar")
	if got := state(); got != unchanged {
		t.Errorf("after an interrupted upload:\n%s\nwant\n%s", got, unchanged)
	}

	// Failed midway: a sparse file larger than the workspace's disk fills
	// it after a has been extracted.
	big := filepath.Join(src, "zz-big")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 200<<20); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := e.runData(t, "", "ws", "cp", "-r", src, id+":/work")
	if err == nil || !strings.Contains(err.Error(), "tar in the workspace") || strings.Contains(err.Error(), "left in") {
		t.Fatalf("an upload larger than the disk: %v (%s), want tar's failure with its staging removed", err, stderr)
	}
	if got := state(); got != unchanged {
		t.Errorf("after an upload that filled the disk:\n%s\nwant\n%s", got, unchanged)
	}
	os.Remove(big)

	// Stopped by the destination: a file of the copy where it holds a
	// directory. Entries before it are moved, each whole.
	if err := os.WriteFile(filepath.Join(src, "sub"), []byte("a file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, err = e.runData(t, "", "ws", "cp", "-r", src, id+":/work")
	if err == nil || !strings.Contains(err.Error(), "/work/dest/sub") || strings.Contains(err.Error(), "left in") {
		t.Fatalf("a file onto a directory: %v (%s), want it named, with the staging removed", err, stderr)
	}
	if got, want := state(), "a\nmine\nsub\n--\nnew\n--\ndest\n"; got != want {
		t.Errorf("after an upload stopped by a directory:\n%s\nwant\n%s", got, want)
	}

	// A whole one: merged, files replaced, what only the destination
	// holds kept.
	os.Remove(filepath.Join(src, "sub"))
	e.sh(t, id, "echo old > /work/dest/a")
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", src, id+":/work"); err != nil {
		t.Fatalf("cp -r: %v\n%s", err, stderr)
	}
	if got, want := state(), "a\nmine\nsub\n--\nnew\n--\ndest\n"; got != want {
		t.Errorf("after a whole upload:\n%s\nwant\n%s", got, want)
	}
}

// TestCpRecursiveUploadAsAUserAndAcrossMounts: an upload as a user keeps
// the copy's top mode and a setgid directory's group, goes on without
// its staging where the user may write the copy's entries but not the
// destination itself, and is placed whole across a Volume mounted inside
// the destination. A source of .. lands under its own name.
func TestCpRecursiveUploadAsAUserAndAcrossMounts(t *testing.T) {
	e := newUpEnv(t)
	id := e.createWorkspace(t, append([]string{"--wait", "--volume", "NEW:/work/proj/data"}, smallWorkspace...)...).GetWorkspaceId()
	var stderr string
	e.sh(t, id, `echo alice:x:1000:1000::/home/alice:/bin/sh >> /etc/passwd && echo alice:x:1000: >> /etc/group &&
		echo team:x:1100:alice >> /etc/group && mkdir -p /home/alice /srv/team /srv/shared/alice &&
		chown alice:alice /home/alice /srv/shared/alice && chown root:team /srv/team && chmod 2775 /srv/team &&
		echo old > /work/proj/data/in.csv`)
	local := t.TempDir()
	tree := func(top string, files map[string]string) string {
		t.Helper()
		for name, data := range files {
			p := filepath.Join(local, top, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return filepath.Join(local, top)
	}
	cp := func(args ...string) string {
		t.Helper()
		_, stderr, err := e.runData(t, "", append([]string{"ws", "cp", "-r"}, args...)...)
		if err != nil {
			t.Fatalf("ws cp -r %v: %v\n%s", args, err, stderr)
		}
		return stderr
	}

	m1 := tree("m1", map[string]string{"y": "y", "sub/x": "x"})
	if err := os.Chmod(filepath.Join(m1, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	cp("--user", "alice", m1, id+":/home/alice/")
	if got, want := e.sh(t, id, "stat -c '%a %U' /home/alice/m1 /home/alice/m1/sub /home/alice/m1/sub/x"), "755 alice\n750 alice\n644 alice\n"; got != want {
		t.Errorf("a new tree as alice:\n%s\nwant\n%s", got, want)
	}

	cp("--user", "alice", tree("team", map[string]string{"sub/a": "a"}), id+":/srv/")
	if got, want := e.sh(t, id, "stat -c '%A %G' /srv/team /srv/team/sub /srv/team/sub/a; ls -A /srv/team"), "drwxrwsr-x team\ndrwxr-sr-x team\n-rw-r--r-- team\nsub\n"; got != want {
		t.Errorf("into a setgid directory as alice:\n%s\nwant\n%s", got, want)
	}
	for _, user := range []string{"alice", "root"} {
		name := "fresh-" + user
		cp("--user", user, tree(name, map[string]string{"sub/b": "b"}), id+":/srv/team/")
		got := e.sh(t, id, fmt.Sprintf("cd /srv/team/%s && stat -c '%%A %%G' . sub sub/b", name))
		if want := "drwxr-sr-x team\ndrwxr-sr-x team\n-rw-r--r-- team\n"; got != want {
			t.Errorf("a new tree in a setgid directory as %s:\n%s\nwant\n%s", user, got, want)
		}
	}

	stderr = cp("--user", "alice", tree("shared", map[string]string{"alice/report.txt": "report"}), id+":/srv/")
	if !strings.Contains(stderr, "cannot stage the copy in") {
		t.Errorf("stderr %q, want the copy said to be unstaged", stderr)
	}
	if got := e.sh(t, id, "cat /srv/shared/alice/report.txt; ls -A /srv/shared"); got != "reportalice\n" {
		t.Errorf("into a directory alice may not write: %q", got)
	}

	proj := tree("proj", map[string]string{"main.py": "print(1)", "data/in.csv": "1,2", "data/more/m": "m"})
	cp(proj, id+":/work")
	if got, want := e.sh(t, id, "cat /work/proj/main.py /work/proj/data/in.csv /work/proj/data/more/m; ls -A /work/proj /work/proj/data"),
		"print(1)1,2m/work/proj:\ndata\nmain.py\n\n/work/proj/data:\nin.csv\nlost+found\nmore\n"; got != want {
		t.Errorf("across the Volume mounted in the destination:\n%s\nwant\n%s", got, want)
	}

	e.sh(t, id, "ln -s /nowhere /work/dangling")
	_, stderr, err := e.runData(t, "", "ws", "cp", "-r", m1, id+":/work/dangling")
	if err == nil || !strings.Contains(err.Error(), "/work/dangling is a symlink to /nowhere, which is not there") {
		t.Errorf("onto a dangling symlink: %v (%s), want it said so", err, stderr)
	}

	child := filepath.Join(tree("pp", map[string]string{"notes": "from pp", "child/c": "c"}), "child")
	e.sh(t, id, "mkdir -p /work/dd/ee && echo precious > /work/dd/notes")
	cp(filepath.Join(child, ".."), id+":/work/dd/ee")
	if got := e.sh(t, id, "cat /work/dd/notes /work/dd/ee/pp/notes"); got != "precious\nfrom pp" {
		t.Errorf("a copy of ..: %q, want it under its own name", got)
	}
}

// TestCpRecursiveUploadAsAUserOfClosedDirectories uploads, as a user
// who is not root, a tree whose directories (its top too) are read-only,
// unreadable or closed, as a Go module cache's are: it lands whole, with
// their modes and times, and an upload that fails leaves no staging
// directory that the user could not remove.
func TestCpRecursiveUploadAsAUserOfClosedDirectories(t *testing.T) {
	e, id := newDataEnv(t)
	src := filepath.Join(t.TempDir(), "rotree")
	for name, data := range map[string]string{"ro/f": "f\n", "ro/inner/i": "i\n", "nordir/g": "g\n", "zclosed/h": "h\n"} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	when := time.Unix(981173106, 0)
	for _, d := range []struct {
		name string
		mode fs.FileMode
	}{{"ro/inner", 0o500}, {"ro", 0o555}, {"nordir", 0o311}, {"zclosed", 0}, {".", 0o555}} {
		p := filepath.Join(src, d.name)
		if err := os.Chtimes(p, when, when); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { exec.Command("chmod", "-R", "u+rwx", src).Run() })

	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", "--user", "nobody", src, id+":/tmp/rotree"); err != nil {
		t.Errorf("cp -r as nobody: %v\n%s", err, stderr)
	}
	got := e.sh(t, id, `(cd /tmp/rotree && stat -c '%n %a %U %Y' . ro ro/inner nordir zclosed && cat ro/f ro/inner/i nordir/g zclosed/h) 2>&1; true`)
	want := ". 555 nobody 981173106\nro 555 nobody 981173106\nro/inner 500 nobody 981173106\nnordir 311 nobody 981173106\nzclosed 0 nobody 981173106\nf\ni\ng\nh\n"
	if got != want {
		t.Errorf("in the guest:\n%s\nwant\n%s", got, want)
	}

	// A tar that fails once it has extracted the tree (whose top is open
	// this time, so that it gets that far).
	if err := os.Chmod(src, 0o755); err != nil {
		t.Fatal(err)
	}
	e.sh(t, id, `mkdir -p /usr/local/bin && printf '#!/bin/sh\nbusybox tar "$@"; exit 1\n' > /usr/local/bin/tar && chmod +x /usr/local/bin/tar`)
	_, stderr, err := e.runData(t, "", "ws", "cp", "-r", "--user", "nobody", src, id+":/tmp/again")
	if err == nil || strings.Contains(err.Error(), "left in") {
		t.Errorf("an upload whose tar fails: %v (%s), want it to fail with its staging removed", err, stderr)
	}
	if got := e.sh(t, id, "ls -A /tmp"); got != "rotree\n" {
		t.Errorf("after a failed upload, /tmp holds:\n%s", got)
	}
}

// TestCpRecursiveSpecialBitsAndSymlinkTimes: a download keeps the setgid
// and sticky bits of directories, drops the setuid and setgid bits of
// files (the copy belongs to whoever runs the CLI), and keeps symlinks'
// modification times; an upload as root keeps all three bits, as the
// workspace's tar applies them.
func TestCpRecursiveSpecialBitsAndSymlinkTimes(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, `mkdir -p /root/sb/sg /root/sb/st && chmod 2775 /root/sb/sg && chmod 1777 /root/sb/st &&
		echo u > /root/sb/suid && chmod 4755 /root/sb/suid && echo g > /root/sb/sgid && chmod 2755 /root/sb/sgid &&
		ln -s suid /root/sb/link && touch -h -d '2001-02-03 04:05:06' /root/sb/link`)
	back := filepath.Join(t.TempDir(), "sb")
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/root/sb", back); err != nil {
		t.Fatalf("cp -r down: %v\n%s", err, stderr)
	}
	var got strings.Builder
	for _, name := range []string{"sg", "st", "suid", "sgid", "link"} {
		st, err := os.Lstat(filepath.Join(back, name))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&got, "%s %s\n", name, st.Mode())
		if name == "link" && st.ModTime().Unix() != 981173106 {
			t.Errorf("the symlink's modification time: %v, want 2001-02-03 04:05:06 UTC", st.ModTime().UTC())
		}
	}
	if want := "sg dgrwxrwxr-x\nst dtrwxrwxrwx\nsuid -rwxr-xr-x\nsgid -rwxr-xr-x\nlink Lrwxrwxrwx\n"; got.String() != want {
		t.Errorf("the download:\n%s\nwant\n%s", got.String(), want)
	}

	if err := os.Chmod(filepath.Join(back, "suid"), fs.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", back, id+":/root/up"); err != nil {
		t.Fatalf("cp -r up: %v\n%s", err, stderr)
	}
	if got, want := e.sh(t, id, "cd /root/up && stat -c '%n %a' sg st suid"), "sg 2775\nst 1777\nsuid 4755\n"; got != want {
		t.Errorf("the upload:\n%s\nwant\n%s", got, want)
	}

	// Hard links of the local tree stay one file, whose bytes go once.
	linked := filepath.Join(t.TempDir(), "linked")
	if err := os.MkdirAll(filepath.Join(linked, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(linked, "a"), []byte("one file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"b", "sub/c"} {
		if err := os.Link(filepath.Join(linked, "a"), filepath.Join(linked, name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", linked, id+":/root/linked"); err != nil {
		t.Fatalf("cp -r up: %v\n%s", err, stderr)
	}
	if got := e.sh(t, id, "cd /root/linked && stat -c '%h %i' a b sub/c | uniq -c | wc -l; stat -c %h a; cat sub/c"); got != "1\n3\none file\n" {
		t.Errorf("three names of one file uploaded: %q, want them one file of 3 links", got)
	}
}

// TestCpRecursiveDownloadReadsTheRecord: a guest tar that pads its
// archive to a whole record after the end-of-archive blocks, as GNU tar
// does, is read to its end, and the copy completes.
func TestCpRecursiveDownloadReadsTheRecord(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, `mkdir -p /usr/local/bin /root/tree && echo one > /root/tree/f
printf '#!/bin/sh\nbusybox tar "$@" && head -c 10240 /dev/zero\n' > /usr/local/bin/tar && chmod +x /usr/local/bin/tar`)
	back := filepath.Join(t.TempDir(), "back")
	done := make(chan error, 1)
	go func() {
		_, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/root/tree", back)
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, stderr)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("cp -r of a padded archive still runs after 30 s")
	}
	if got, err := os.ReadFile(filepath.Join(back, "f")); err != nil || string(got) != "one\n" {
		t.Errorf("the copy holds %q, %v", got, err)
	}
}

// TestCpRecursiveDownloadAsAUser runs `ws cp -r` out of a workspace as a
// user who is not root, as the CLI mostly runs: a tree with a read-only
// and a closed directory lands with their modes, and a download that fails
// after its tree was extracted leaves no temporary behind, which that user
// could not have removed had its read-only directories been closed there.
func TestCpRecursiveDownloadAsAUser(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, `mkdir -p /root/tree/ro /root/tree/closed && echo one > /root/tree/ro/f && echo two > /root/tree/closed/g &&
		chmod 0555 /root/tree/ro && chmod 0 /root/tree/closed`)
	home := userDir(t, nobody)
	dir := filepath.Join(home, "copies") // beside the CLI's cache
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLIAs(t, nobody, home, "ws", "cp", "-r", "--addr", e.addr, "--token", e.token, id+":/root/tree", filepath.Join(dir, "a")); err != nil {
		t.Fatalf("cp -r as uid %d: %v\n%s", nobody, err, out)
	}
	if got := describeTree(t, filepath.Join(dir, "a")); got != ". drwxr-xr-x\nclosed d---------\nclosed/g -rw-r--r-- two\n\nro dr-xr-xr-x\nro/f -rw-r--r-- one\n\n" {
		t.Errorf("the copy as uid %d:\n%s", nobody, got)
	}

	// A tar that fails once its archive is written.
	e.sh(t, id, `mkdir -p /usr/local/bin && printf '#!/bin/sh\nbusybox tar "$@"; exit 1\n' > /usr/local/bin/tar && chmod +x /usr/local/bin/tar`)
	if out, err := runCLIAs(t, nobody, home, "ws", "cp", "-r", "--addr", e.addr, "--token", e.token, id+":/root/tree", filepath.Join(dir, "b")); err == nil {
		t.Fatalf("cp -r with a failing tar succeeded:\n%s", out)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"a"}) {
		t.Errorf("after a failed download, %s holds %v, want [a]", dir, names)
	}
}

// nobody is the user ID of the CLI runs that are not root.
const nobody = 65534

// userDir returns a new directory that uid owns, in a directory of its
// own that uid may enter (a test's TempDir is in a closed one).
func userDir(t *testing.T, uid int) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "kibotos-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "home")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	return dir
}

// envRunCLI makes the test binary the CLI (see TestMain).
const envRunCLI = "KIBOTOS_TEST_RUN_CLI"

// runCLIAs runs `kibotos args...` as uid, in a process of its own (a copy
// of the test binary, which runs the CLI), with home as its HOME, and
// returns its combined output.
func runCLIAs(t *testing.T, uid int, home string, args ...string) (string, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(filepath.Dir(home), "kibotos")
	if _, err := os.Stat(bin); err != nil { // the test binary's own directory is closed to uid
		data, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Dir = home
	cmd.Env = []string{envRunCLI + "=1", "HOME=" + home, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestCpRecursiveRefusesEscapes copies trees holding symlinks that point
// outside the copy, both ways: each is refused with an error that names
// it, and nothing is written on the other side.
func TestCpRecursiveRefusesEscapes(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, `mkdir -p /work/abs/sub /work/climb/sub /work/chain/a && echo x > /work/abs/f && ln -s /etc/passwd /work/abs/sub/pw &&
		ln -s ../../.. /work/climb/sub/up && cd /work/chain && ln -s .. a/b && ln -s a/b u0 && ln -s u0/.. u1 && ln -s u1/etc/hostname host`)
	dir := t.TempDir()
	for _, tc := range []struct{ src, want string }{
		{"/work/abs", "symlink sub/pw -> /etc/passwd is absolute and would point outside the copy: refused"},
		{"/work/climb", "symlink sub/up -> ../../.. leads outside the copy: refused"},
		{"/work/chain", "symlink host -> u1/etc/hostname leads outside the copy through other symlinks of it: refused"},
	} {
		_, _, err := e.runData(t, "", "ws", "cp", "-r", id+":"+tc.src, filepath.Join(dir, "out"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("cp -r %s: %v, want %q", tc.src, err, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused downloads left %v", entries)
	}

	src := filepath.Join(t.TempDir(), "up")
	makeTree(t, src)
	if err := os.Symlink("/etc/hostname", filepath.Join(src, "nested", "host")); err != nil {
		t.Fatal(err)
	}
	_, _, err := e.runData(t, "", "ws", "cp", "-r", src, id+":/work/up")
	if err == nil || !strings.Contains(err.Error(), "symlink nested/host -> /etc/hostname is absolute") {
		t.Errorf("cp -r up with an absolute link: %v", err)
	}
	chain := filepath.Join(t.TempDir(), "chain")
	makeTree(t, chain)
	for name, target := range map[string]string{"nested/up": "..", "u0": "nested/up", "u1": "u0/.."} {
		if err := os.Symlink(target, filepath.Join(chain, name)); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err = e.runData(t, "", "ws", "cp", "-r", chain, id+":/work/up")
	if err == nil || !strings.Contains(err.Error(), "symlink u1 -> u0/.. leads outside the copy through other symlinks") {
		t.Errorf("cp -r up with a chain of links out of the copy: %v", err)
	}
	if got := e.sh(t, id, "ls /work"); strings.Contains(got, "up") {
		t.Errorf("a refused upload created /work/up: %s", got)
	}
}

// TestResolvesOutside: links are followed through one another as the
// kernel would; chains that stay inside, and loops (which resolve to
// nothing), are not outside.
func TestResolvesOutside(t *testing.T) {
	for _, tc := range []struct {
		links   map[string]string
		name    string
		outside bool
	}{
		{map[string]string{"x": "y", "y": "d/f"}, "x", false},
		{map[string]string{"d/l": "../e/f"}, "d/l", false},
		{map[string]string{"d/up": "..", "l": "d/up/d/up/f"}, "l", false},
		{map[string]string{"d/up": "..", "l": "d/up/.."}, "l", true},
		{map[string]string{"a": "b", "b": "a"}, "a", false},
		{map[string]string{"a": "a/.."}, "a", false},
		{map[string]string{"d/l": "../s/x", "s": "d/.."}, "d/l", false},
		{map[string]string{"d/l": "../s/../x", "s": "d/l/.."}, "d/l", false},
		{map[string]string{"l": "s/../..", "s": "d"}, "l", true},
	} {
		if got := resolvesOutside(tc.links, tc.name); got != tc.outside {
			t.Errorf("%s in %v: outside %v, want %v", tc.name, tc.links, got, tc.outside)
		}
	}
}

// TestExtractTreeRefusesEscapingEntries feeds extractTree streams a guest
// could send: names with .., absolute names, entries beneath a symlink,
// hard links out of the tree. Each is refused, and nothing is written
// outside the directory.
func TestExtractTreeRefusesEscapingEntries(t *testing.T) {
	type entry struct {
		name, link string
		typ        byte
	}
	for _, tc := range []struct {
		entries []entry
		want    string
	}{
		{[]entry{{name: "../evil", typ: tar.TypeReg}}, `entry "../evil" lands outside the destination: refused`},
		{[]entry{{name: "a/../../evil", typ: tar.TypeReg}}, `entry "a/../../evil" lands outside`},
		{[]entry{{name: "/etc/evil", typ: tar.TypeReg}}, `entry "/etc/evil" lands outside`},
		{[]entry{{name: "d", typ: tar.TypeDir}, {name: "d/l", link: ".", typ: tar.TypeSymlink}, {name: "d/l/x", typ: tar.TypeReg}},
			`entry "d/l/x" is beneath the symlink d/l: refused`},
		{[]entry{{name: "h", link: "../../etc/passwd", typ: tar.TypeLink}}, "hard link h -> ../../etc/passwd lands outside"},
		{[]entry{{name: "l", link: "/", typ: tar.TypeSymlink}}, "symlink l -> / is absolute"},
		// Each link local as text; u1 leads out through u0 and a/b.
		{[]entry{{name: "a", typ: tar.TypeDir}, {name: "a/b", link: "..", typ: tar.TypeSymlink}, {name: "u0", link: "a/b", typ: tar.TypeSymlink},
			{name: "u1", link: "u0/..", typ: tar.TypeSymlink}}, "symlink u1 -> u0/.. leads outside the copy through other symlinks of it: refused"},
		// The link comes before those it goes through.
		{[]entry{{name: "host", link: "u/etc/hostname", typ: tar.TypeSymlink}, {name: "d", typ: tar.TypeDir}, {name: "d/up", link: "..", typ: tar.TypeSymlink},
			{name: "u", link: "d/up/d/up/..", typ: tar.TypeSymlink}}, "leads outside the copy through other symlinks"},
		// A hard link of a symlink that stays inside from where it is:
		// the same symlink one level up leads out.
		{[]entry{{name: "a", typ: tar.TypeDir}, {name: "a/b", typ: tar.TypeDir}, {name: "a/b/l", link: "../../x", typ: tar.TypeSymlink},
			{name: "top", link: "a/b/l", typ: tar.TypeLink}}, "symlink top -> ../../x"},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range tc.entries {
			if err := tw.WriteHeader(&tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644}); err != nil {
				t.Fatal(err)
			}
		}
		tw.Close()
		parent := t.TempDir()
		dir := filepath.Join(parent, "x")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := extractTree(&buf, dir, func(string) {})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.entries, err, tc.want)
		}
		if entries, _ := os.ReadDir(parent); len(entries) != 1 {
			t.Errorf("%v wrote beside the directory: %v", tc.entries, entries)
		}
	}
}

// TestExtractTreeRefusesSparseEntries: a sparse entry, which the
// workspace's tar does not write but a guest's own program may, would be
// written with all its holes, as large as it declares; it is refused.
func TestExtractTreeRefusesSparseEntries(t *testing.T) {
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "big"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("end"), 1<<30) // a GiB of hole first
	if err = errors.Join(err, f.Close()); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"pax", "gnu"} { // PAX sparse 1.0, and GNU tar's own default
		archive := filepath.Join(t.TempDir(), "sparse.tar")
		if out, err := exec.Command("tar", "-S", "--format="+format, "-cf", archive, "-C", src, "big").CombinedOutput(); err != nil {
			t.Skipf("GNU tar writes no sparse archive here: %v: %s", err, out)
		}
		r, err := os.Open(archive)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if _, err := extractTree(r, dir, func(string) {}); err == nil || !strings.Contains(err.Error(), "sparse file") {
			t.Errorf("%s: a sparse entry: %v, want it refused", format, err)
		}
		r.Close()
		if _, err := os.Stat(filepath.Join(dir, "big")); err == nil {
			t.Errorf("%s: the sparse entry was written", format)
		}
	}
}

// TestCpDownloadKeepsHoles downloads a file of a GiB with a hole before
// its last byte, in a tree with `ws cp -r` and alone with `ws cp`: the
// hole crosses the wire as zeros, which land as a hole again, so each copy
// takes far less room than its size, with the same bytes.
func TestCpDownloadKeepsHoles(t *testing.T) {
	e, id := newDataEnv(t)
	const size = 1 << 30
	e.sh(t, id, fmt.Sprintf("mkdir -p /root/sp && echo small > /root/sp/small && truncate -s %d /root/sp/big && printf x >> /root/sp/big", size-1))
	dir := t.TempDir()
	tree, single := filepath.Join(dir, "tree"), filepath.Join(dir, "single")
	if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/root/sp", tree); err != nil {
		t.Fatalf("cp -r: %v\n%s", err, stderr)
	}
	if _, stderr, err := e.runData(t, "", "ws", "cp", id+":/root/sp/big", single); err != nil {
		t.Fatalf("cp: %v\n%s", err, stderr)
	}
	for _, name := range []string{filepath.Join(tree, "big"), single} {
		var st syscall.Stat_t
		if err := syscall.Stat(name, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != size || st.Blocks*512 > 1<<20 {
			t.Errorf("%s: %d bytes in %d bytes of blocks, want %d bytes in at most 1 MiB", name, st.Size, st.Blocks*512, size)
		}
		if err := wantZerosThen(name, "x"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(tree, "small")); err != nil || string(got) != "small\n" {
		t.Errorf("the tree's small file: %q, %v", got, err)
	}
}

// wantZerosThen says how the file name differs from zero bytes followed
// by end.
func wantZerosThen(name, end string) error {
	data, err := os.Open(name)
	if err != nil {
		return err
	}
	defer data.Close()
	st, err := data.Stat()
	if err != nil {
		return err
	}
	zeros := st.Size() - int64(len(end))
	buf := make([]byte, 1<<20)
	for off := int64(0); off < zeros; {
		n, err := data.Read(buf[:min(int64(len(buf)), zeros-off)])
		if i := bytes.IndexFunc(buf[:n], func(r rune) bool { return r != 0 }); i >= 0 {
			return fmt.Errorf("a byte other than zero at %d", off+int64(i))
		}
		if off += int64(n); err != nil {
			return err
		}
	}
	tail, err := io.ReadAll(data)
	if err != nil || string(tail) != end {
		return fmt.Errorf("ends in %q (%v), want %q", tail, err, end)
	}
	return nil
}
