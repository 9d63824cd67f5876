package diskimage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestUnmountOfABusyMount: a mount whose reader is still closing its
// files is unmounted once it has; a read-only one still held after that is
// detached and goes when its holder lets go.
func TestUnmountOfABusyMount(t *testing.T) {
	needHost(t)
	img := filepath.Join(t.TempDir(), "ws.ext4")
	if err := Create(context.Background(), img, 8*MiB, ""); err != nil {
		t.Fatal(err)
	}
	for _, held := range []time.Duration{unmountBusyFor / 4, unmountBusyFor + time.Second} {
		dir, unmount, err := Mount(img, filepath.Dir(img), true)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(held, func() { f.Close() })
		if err := unmount(); err != nil {
			t.Errorf("unmounting a mount held for %s: %v", held, err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) || len(LoopsOf(img)) != 0 {
			t.Errorf("held for %s: the directory (%v) or a loop device (%v) is left", held, err, LoopsOf(img))
		}
	}

	// A writable mount held past the retries is an error (its writes may
	// not all be on the image), but is detached: nothing is left mounted.
	dir, unmount, err := Mount(img, filepath.Dir(img), false)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := unmount(); err == nil || !errors.Is(err, syscall.EBUSY) {
		t.Errorf("unmounting a writable mount still held: %v, want EBUSY", err)
	}
	f.Close()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) || !WaitLoopsReleased(img, 10*time.Second) {
		t.Errorf("a writable mount held: the directory (%v) or a loop device (%v) is left once its holder let go", err, LoopsOf(img))
	}
}

// TestDataBytes: what Inspect says an image's files take (DataBytes) is
// what statfs of its mount says, fresh (s_overhead_clusters
// recorded) and grown (resize2fs clears it: the overhead is computed as
// the kernel does), for both block sizes mkfs picks here.
func TestDataBytes(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	for _, c := range []struct{ size, grown uint64 }{{64 * MiB, 0}, {256 * MiB, 0}, {64 * MiB, 600 * MiB}, {1024 * MiB, 0}} {
		img := filepath.Join(t.TempDir(), "v.ext4")
		if err := Create(ctx, img, c.size, ""); err != nil {
			t.Fatal(err)
		}
		if c.grown != 0 {
			if err := Grow(ctx, img, c.grown); err != nil {
				t.Fatal(err)
			}
		}
		fresh, err := Inspect(img)
		if err != nil {
			t.Fatal(err)
		}
		if fresh.DataBytes > MiB {
			t.Errorf("%d MiB (grown to %d): an empty filesystem's files take %d bytes", c.size/MiB, c.grown/MiB, fresh.DataBytes)
		}
		mnt, _, unmount := mountImage(t, img, 0)
		if err := os.WriteFile(filepath.Join(mnt, "data"), make([]byte, 3*MiB), 0o644); err != nil {
			t.Fatal(err)
		}
		used, _, err := Usage(mnt)
		if err != nil {
			t.Fatal(err)
		}
		unmount()
		info, err := Inspect(img)
		if err != nil {
			t.Fatal(err)
		}
		if info.DataBytes != used {
			t.Errorf("%d MiB (grown to %d): Inspect says the files take %d bytes, statfs of the mount %d", c.size/MiB, c.grown/MiB, info.DataBytes, used)
		}
	}
}
