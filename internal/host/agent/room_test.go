package agent

import (
	"os"
	"path/filepath"
	"testing"

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
	hosttest.WriteFiles(t, map[string]int{filepath.Join(layers, "a.ext4"): 4 << 20, filepath.Join(volumes, "v.ext4"): 2 << 20})
	sparse, err := os.Create(filepath.Join(layers, "sparse.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	sparse.Truncate(1 << 30)
	sparse.Close()
	free := hosttest.FreeBytes(t, fs)
	if got := Room(layers); got != free+4<<20 {
		t.Errorf("room of the layers: %d, want the free %d and the 4 MiB written", got, free)
	}
	if got := Room(layers, volumes, t.TempDir()); got != free+6<<20 {
		t.Errorf("room of the layers beside the volumes: %d, want the free %d and the 6 MiB written", got, free)
	}
}
