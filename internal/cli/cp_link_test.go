package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCpOfSymlinkGetsTheTargetsMode copies symlinks out of a Workspace: the
// local file gets the mode of the file the link leads to (through relative
// and chained links), never the link's own 0777; a loop fails and writes
// nothing.
func TestCpOfSymlinkGetsTheTargetsMode(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, `mkdir -p /work /opt/bin && printf secret > /opt/secret && chmod 600 /opt/secret &&
		printf tool > /opt/bin/tool && chmod 755 /opt/bin/tool &&
		ln -s /opt/secret /work/abs && ln -s ../opt/bin/tool /work/rel && ln -s rel /work/chain &&
		ln -s loop2 /work/loop && ln -s /work/loop /work/loop2 && ln -s /work /work/dirlink`)
	dir := t.TempDir()
	cp := func(src, dst string) error {
		_, _, err := e.runData(t, "", "ws", "cp", id+":"+src, dst)
		return err
	}

	for _, tc := range []struct {
		src  string
		mode os.FileMode
		data string
	}{
		{"/work/abs", 0o600, "secret"},
		{"/work/rel", 0o755, "tool"},
		{"/work/chain", 0o755, "tool"},
	} {
		dst := filepath.Join(dir, filepath.Base(tc.src))
		if err := cp(tc.src, dst); err != nil {
			t.Fatalf("cp %s: %v", tc.src, err)
		}
		st, err := os.Stat(dst)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(dst); st.Mode().Perm() != tc.mode || string(got) != tc.data {
			t.Errorf("cp %s: %v %q, want %v %q", tc.src, st.Mode().Perm(), got, tc.mode, tc.data)
		}
	}
	if err := cp("/work/loop", filepath.Join(dir, "loop")); err == nil || !strings.Contains(err.Error(), "too many levels of symbolic links") {
		t.Errorf("cp of a link loop: %v", err)
	}
	if err := cp("/work/dirlink", filepath.Join(dir, "d")); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("cp of a link to a directory: %v", err)
	}
	for _, name := range []string{"loop", "d"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("a failed cp left %s: %v", name, err)
		}
	}
}

// TestCpOfKernelFilesAndFifos copies out of a Workspace what a kernel
// filesystem makes up as it is read (proc's files say 0 bytes, sysfs's
// 4096): the local file holds what cat shows. A fifo, which would give
// whatever some writer happens to send, is refused and nothing written.
func TestCpOfKernelFilesAndFifos(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, "mkfifo /root/fifo")
	dir := t.TempDir()
	for _, src := range []string{"/proc/version", "/proc/self/mounts", "/sys/devices/system/cpu/online"} {
		dst := filepath.Join(dir, filepath.Base(src))
		if _, stderr, err := e.runData(t, "", "ws", "cp", id+":"+src, dst); err != nil {
			t.Fatalf("cp %s: %v: %s", src, err, stderr)
		}
		got, _ := os.ReadFile(dst)
		if want := e.sh(t, id, "cat "+src); len(got) == 0 || src != "/proc/self/mounts" && string(got) != want {
			t.Errorf("cp %s wrote %q; cat shows %q", src, got, want)
		}
	}
	_, _, err := e.runData(t, "", "ws", "cp", id+":/root/fifo", filepath.Join(dir, "fifo"))
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("cp of a fifo: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "fifo")); !os.IsNotExist(err) {
		t.Errorf("a refused cp left a file: %v", err)
	}
}

// TestCpOfALongName: a file of the longest name a directory holds is
// copied both ways (a temporary name made from it would not fit).
func TestCpOfALongName(t *testing.T) {
	e, id := newDataEnv(t)
	name := strings.Repeat("n", 255)
	local := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(local, []byte("long\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := e.runData(t, "", "ws", "cp", local, id+":/root/"); err != nil {
		t.Fatalf("upload of a 255-byte name: %v: %s", err, stderr)
	}
	back := filepath.Join(t.TempDir(), name)
	if _, stderr, err := e.runData(t, "", "ws", "cp", id+":/root/"+name, back); err != nil {
		t.Fatalf("download of a 255-byte name: %v: %s", err, stderr)
	}
	if b, err := os.ReadFile(back); err != nil || string(b) != "long\n" {
		t.Errorf("the round trip: %q, %v", b, err)
	}
	// A directory of such a name, both ways with -r, to a new name and
	// into one that exists.
	tree := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "f"), []byte("in a long one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	into := t.TempDir()
	for range 2 {
		if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", tree, id+":/tmp/"); err != nil {
			t.Fatalf("upload of a directory of a 255-byte name: %v: %s", err, stderr)
		}
		if _, stderr, err := e.runData(t, "", "ws", "cp", "-r", id+":/tmp/"+name, into); err != nil {
			t.Fatalf("download of a directory of a 255-byte name: %v: %s", err, stderr)
		}
		if b, err := os.ReadFile(filepath.Join(into, name, "f")); err != nil || string(b) != "in a long one\n" {
			t.Errorf("the round trip of the directory: %q, %v", b, err)
		}
	}
}

// TestCpIntoALinkToADirectory: a file copied to a symlink that names a
// directory lands in that directory, as cp(1) puts it.
func TestCpIntoALinkToADirectory(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, "mkdir -p /root/dir && ln -s dir /root/link")
	local := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(local, []byte("into\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := e.runData(t, "", "ws", "cp", local, id+":/root/link"); err != nil {
		t.Fatalf("cp into a link to a directory: %v: %s", err, stderr)
	}
	if got := e.sh(t, id, "cat /root/dir/f"); got != "into\n" {
		t.Errorf("the copy in the directory: %q", got)
	}
}
