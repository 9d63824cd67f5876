package diskimage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// held is how many bytes of the host's filesystem the file at path holds.
func held(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(fi.Sys().(*syscall.Stat_t).Blocks) * 512
}

// TestReserve: a sparse image comes to hold every block of its size, with
// its filesystem as it was; an image the host's filesystem cannot hold is
// refused with ENOSPC, saying how little is free.
func TestReserve(t *testing.T) {
	needHost(t)
	dir := t.TempDir()
	hosttest.Tmpfs(t, dir, "24m")
	ctx := context.Background()
	img := filepath.Join(dir, "ws.ext4")
	if err := Create(ctx, img, 8*MiB, "0b7cbd52-0000-4000-8000-000000000001"); err != nil {
		t.Fatal(err)
	}
	if h := held(t, img); h >= 8*MiB {
		t.Fatalf("a new image holds %d bytes: not sparse, nothing to test", h)
	}
	for range 2 { // the second finds nothing left to do
		if err := Reserve(img); err != nil {
			t.Fatal(err)
		}
		if h := held(t, img); h < 8*MiB {
			t.Errorf("a reserved image of 8 MiB holds %d bytes", h)
		}
	}
	if info, err := Inspect(img); err != nil || info.UUID != "0b7cbd52-0000-4000-8000-000000000001" {
		t.Errorf("the reserved image: %+v, %v", info, err)
	}

	big := filepath.Join(dir, "big.ext4")
	if err := Create(ctx, big, 32*MiB, ""); err != nil {
		t.Fatal(err)
	}
	err := Reserve(big)
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "the host's disk has") || !strings.Contains(err.Error(), "all 32 MiB") {
		t.Errorf("reserving 32 MiB on a filesystem of 24: %v, want ENOSPC saying what is missing", err)
	}
}
