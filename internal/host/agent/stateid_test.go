package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStateID: a layer directory keeps the state ID made at its first
// start; another directory, or the same one emptied, has another.
func TestStateID(t *testing.T) {
	dir := t.TempDir()
	first, err := loadStateID(dir)
	if err != nil || len(first) != 32 {
		t.Fatalf("first start: %q, %v", first, err)
	}
	if again, err := loadStateID(dir); err != nil || again != first {
		t.Errorf("a restart: %q, %v, want %q", again, err, first)
	}
	if other, _ := loadStateID(t.TempDir()); other == first {
		t.Error("another directory has the same state ID")
	}
	os.Remove(filepath.Join(dir, stateIDFile))
	if emptied, _ := loadStateID(dir); emptied == first {
		t.Error("an emptied directory kept its state ID")
	}
}
