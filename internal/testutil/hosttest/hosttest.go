// Package hosttest gives tests what they need of the host: skips for tests
// that need root or runc, and a busybox root filesystem for containers. It
// imports nothing of the module, so that every package's tests may use it.
package hosttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
