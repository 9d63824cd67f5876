// Package hosttest gives tests what they need of the host: skips for tests
// that need root, runc or Xvfb, free X display numbers, a busybox root
// filesystem for containers, small filesystems of their own (Tmpfs) and
// full ones (FillDisk), and the process's thread count. It imports nothing
// of the module, so that every package's tests may use it.
package hosttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Busybox is the static busybox that BusyboxRoot copies: where Debian's
// busybox-static installs it.
const Busybox = "/bin/busybox"

// RequireRoot skips the test unless it runs as root, as `make test` does.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (make test runs as root)")
	}
}

// RequireContainers skips the test unless it can run a container of
// BusyboxRoot with runc: it runs as root, and runc and Busybox are
// installed.
func RequireContainers(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("needs runc")
	}
	RequireBusybox(t)
}

// RequireBusybox skips the test unless Busybox, which BusyboxRoot copies,
// is installed.
func RequireBusybox(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(Busybox); err != nil {
		t.Skip("needs " + Busybox + " (Debian package busybox-static)")
	}
}

// BusyboxRoot builds a root filesystem in a new temporary directory: Busybox
// as /bin/busybox with a link for each of its applets in /bin, the
// directories a container mounts over, a sticky /tmp, root and a user app
// (uid and gid 1000, home /home/app, owned by app) in /etc/passwd and
// /etc/group, and a root-owned /etc/motd reading "busybox\n".
func BusyboxRoot(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	for _, dir := range []string{"bin", "etc", "root", "proc", "sys", "dev", "tmp", "run", "home/app"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(root, "home/app"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(Busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(Busybox, "--list").Output()
	if err != nil {
		t.Fatalf("%s --list: %v", Busybox, err)
	}
	for _, name := range strings.Fields(string(out)) {
		if name == "busybox" || strings.Contains(name, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", name)); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n",
		"etc/group":  "root:x:0:\ntty:x:5:\napp:x:1000:\n",
		"etc/motd":   "busybox\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// RequireXvfb skips the test unless the X server Xvfb is installed
// (scripts/install-deps installs it).
func RequireXvfb(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("Xvfb"); err != nil {
		t.Skip("Xvfb is not installed (scripts/install-deps installs it)")
	}
}

// FreeDisplay returns an X display number that no server of this machine
// uses (neither its lock file nor its socket exists), picked from a range
// that differs between test processes. When the test ends, after the
// cleanups registered later (which end its server), the number's lock file
// and socket are removed: a server killed outright leaves both in the
// host's /tmp.
func FreeDisplay(t testing.TB) int {
	t.Helper()
	for n := 100 + os.Getpid()%500; n < 1000; n++ {
		lock, sock := fmt.Sprintf("/tmp/.X%d-lock", n), fmt.Sprintf("/tmp/.X11-unix/X%d", n)
		_, lockErr := os.Stat(lock)
		_, sockErr := os.Stat(sock)
		if errors.Is(lockErr, os.ErrNotExist) && errors.Is(sockErr, os.ErrNotExist) {
			t.Cleanup(func() {
				os.Remove(lock)
				os.Remove(sock)
			})
			return n
		}
	}
	t.Fatal("no free X display number")
	return 0
}

// Threads is how many OS threads this process has.
func Threads(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), "Threads:")
	line, _, _ := strings.Cut(rest, "\n")
	n, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the Threads line of /proc/self/status: %v", err)
	}
	return n
}

// Tmpfs mounts a tmpfs of size (mount's size=, such as "4m") at dir, an
// existing directory, until the test ends: a filesystem the test may fill.
// It skips the test unless it runs as root.
func Tmpfs(t testing.TB, dir, size string) {
	t.Helper()
	RequireRoot(t)
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
}

// FreeBytes is the space an unprivileged writer may still take on the
// filesystem of dir.
func FreeBytes(t testing.TB, dir string) uint64 {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	return fs.Bavail * uint64(fs.Bsize)
}

// WriteFiles writes each path of files, creating its directory, with as
// many zero bytes as given: blocks a filesystem really holds, unlike a
// sparse file's.
func WriteFiles(t testing.TB, files map[string]int) {
	t.Helper()
	for path, bytes := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, make([]byte, bytes), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// FillDisk takes all but leave bytes of the free space of the filesystem
// of dir with a file there, as an operator's file would, and returns the
// function that frees it (it runs when the test ends too).
func FillDisk(t testing.TB, dir string, leave uint64) (free func()) {
	t.Helper()
	avail := FreeBytes(t, dir)
	if avail < leave {
		t.Fatalf("%d bytes free, fewer than the %d to leave", avail, leave)
	}
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	free = func() { os.Remove(path) }
	t.Cleanup(free)
	if avail > leave {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(avail-leave)); err != nil {
			t.Fatal(err)
		}
	}
	return free
}
