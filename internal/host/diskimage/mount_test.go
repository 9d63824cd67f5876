package diskimage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
}
