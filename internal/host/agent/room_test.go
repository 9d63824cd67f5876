package agent

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestRoomCountsWhatImagesHold: the room of a directory of sparse images
// is its filesystem's free space plus the blocks its images, and those of
// the other directories on that filesystem, hold (not their sizes); a
// directory on another filesystem adds nothing. A host restarted with
// full images so offers what it offered before.
func TestRoomCountsWhatImagesHold(t *testing.T) {
	fs := t.TempDir()
	hosttest.Tmpfs(t, fs, "64m")
	layers, volumes := filepath.Join(fs, "layers"), filepath.Join(fs, "volumes")
	for path, bytes := range map[string]int{filepath.Join(layers, "a.ext4"): 4 << 20, filepath.Join(volumes, "v.ext4"): 2 << 20} {
		os.MkdirAll(filepath.Dir(path), 0o700)
		if err := os.WriteFile(path, make([]byte, bytes), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sparse, err := os.Create(filepath.Join(layers, "sparse.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	sparse.Truncate(1 << 30)
	sparse.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(fs, &st); err != nil {
		t.Fatal(err)
	}
	free := st.Bavail * uint64(st.Bsize)
	if got := Room(layers); got != free+4<<20 {
		t.Errorf("room of the layers: %d, want the free %d and the 4 MiB written", got, free)
	}
	if got := Room(layers, volumes, t.TempDir()); got != free+6<<20 {
		t.Errorf("room of the layers beside the volumes: %d, want the free %d and the 6 MiB written", got, free)
	}
}
