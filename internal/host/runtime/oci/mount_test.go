package oci

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestMountTable: the mount table is read for a directory whose name the
// kernel escapes, a sibling whose name only starts like it stays out, the
// mount roots and their sources are told from plain directories, and
// unmountPoints leaves nothing of the directory mounted.
func TestMountTable(t *testing.T) {
	hosttest.RequireRoot(t)
	base := t.TempDir()
	dir := filepath.Join(base, "a b\\c")
	sub, plainDir, sibling := filepath.Join(dir, "x"), filepath.Join(dir, "y"), dir+"d"
	mount := func(mp string) {
		t.Helper()
		if err := os.MkdirAll(mp, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", mp, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(mp, unix.MNT_DETACH) })
	}
	mount(dir)
	mount(sub)
	mount(sibling)
	if err := os.Mkdir(plainDir, 0o755); err != nil {
		t.Fatal(err)
	}

	pts, err := mountsUnder(dir)
	if err != nil || !slices.Equal(pts, []string{dir, sub}) {
		t.Fatalf("mountsUnder = %q, %v; want %q", pts, err, []string{dir, sub})
	}
	if got := within(pts, sub); !slices.Equal(got, []string{sub}) {
		t.Errorf("within(%q) = %q", sub, got)
	}
	for path, want := range map[string]bool{dir: true, sub: true, sibling: true, plainDir: false, base: false} {
		if got := isMountPoint(path); got != want {
			t.Errorf("isMountPoint(%q) = %v, want %v", path, got, want)
		}
	}
	if src := mountSource(dir); src != "tmpfs" {
		t.Errorf("mountSource(%q) = %q, want tmpfs", dir, src)
	}
	if src := mountSource(plainDir); src != "" {
		t.Errorf("mountSource(%q) = %q, want none", plainDir, src)
	}
	if plain, err := unmountPoints(pts); !plain || err != nil {
		t.Fatalf("unmountPoints = %v, %v", plain, err)
	}
	if pts, err := mountsUnder(dir); err != nil || len(pts) != 0 {
		t.Errorf("after unmountPoints, mounted below %s: %q, %v", dir, pts, err)
	}
	if !isMountPoint(sibling) {
		t.Errorf("the sibling %s was unmounted too", sibling)
	}
}

// TestRemoveSameFSStopsAtMounts: removing an execution's directory never
// enters a mount below it, another filesystem's or a bind mount of its
// own, whose files it would otherwise delete.
func TestRemoveSameFSStopsAtMounts(t *testing.T) {
	hosttest.RequireRoot(t)
	for _, bind := range []bool{false, true} {
		base := t.TempDir()
		data, tree := filepath.Join(base, "data"), filepath.Join(base, "exec")
		mp := filepath.Join(tree, "layer")
		for _, d := range []string{data, mp} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		if bind {
			err = unix.Mount(data, mp, "", unix.MS_BIND, "")
		} else {
			err = unix.Mount("tmpfs", mp, "tmpfs", 0, "size=1m")
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(mp, unix.MNT_DETACH) })
		kept := filepath.Join(mp, "kept")
		if err := os.WriteFile(kept, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := removeSameFS(tree); err == nil {
			t.Errorf("bind %v: removeSameFS removed a tree with a mount below it", bind)
		}
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("bind %v: a file below the mount is gone: %v", bind, err)
		}
	}
}
