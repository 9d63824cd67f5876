package netslot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// A new slot's device has tunQueues queues, and a reopened slot serves
// them all; a device an earlier version made with a single queue is
// reopened with that queue alone.
func TestTUNQueues(t *testing.T) {
	hosttest.RequireRoot(t)
	dir := t.TempDir()
	cfg := Config{Path: filepath.Join(dir, "new")}
	s, err := Create(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyNamespace(cfg.Path) }) // when a check below fails first
	if len(s.queues) != tunQueues {
		t.Errorf("a new slot serves %d queues, want %d", len(s.queues), tunQueues)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	if len(s.queues) != tunQueues {
		t.Errorf("a reopened slot serves %d queues, want %d", len(s.queues), tunQueues)
	}
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}

	single := filepath.Join(dir, "single")
	if err := os.WriteFile(single, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyNamespace(single) })
	if err := netnsfile.Create(single, func() error {
		f, err := attachTUN(0)
		if err == nil {
			f.Close()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := configure(single); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(Config{Path: single}); err != nil {
		t.Fatalf("reopening a single-queue device: %v", err)
	}
	if len(s.queues) != 1 {
		t.Errorf("a single-queue device is served with %d queues", len(s.queues))
	}
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
}
