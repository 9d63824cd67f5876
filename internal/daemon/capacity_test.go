package daemon

import (
	"path/filepath"
	"testing"

	"github.com/kibotos/kibotos/internal/host/agent"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestCapacityAfterRestart: the layer capacity a host registers counts
// the blocks its layer and Volume images already hold, as at a restart,
// with the free space: that alone made a host restarted with full images
// offer less than it has, and nothing on a full disk.
func TestCapacityAfterRestart(t *testing.T) {
	home := t.TempDir()
	hosttest.Tmpfs(t, home, "64m")
	layers, volumes := filepath.Join(home, "layers"), filepath.Join(home, "volumes")
	hosttest.WriteFiles(t, map[string]int{filepath.Join(layers, "ws.ext4"): 8 << 20, filepath.Join(volumes, "vol.ext4"): 4 << 20})
	c, err := hostCapacity(layers, []agent.StoragePool{{Name: "default", Dir: volumes}}, Overcommit{CPU: 1, Memory: 1})
	if err != nil {
		t.Fatal(err)
	}
	if free := hosttest.FreeBytes(t, home); c.LayerBytes != free+12<<20 {
		t.Errorf("layer capacity %d, want the free %d and the 12 MiB the images hold", c.LayerBytes, free)
	}
}
