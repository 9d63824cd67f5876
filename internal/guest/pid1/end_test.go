package pid1

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// TestRecordEnd: the end is recorded as guestabi reads it, replacing what
// the guest left at the name (a link is replaced, not followed), and
// nothing else stays in the directory.
func TestRecordEnd(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	end := filepath.Join(dir, guestabi.EndFile)
	if err := os.Symlink(target, end); err != nil {
		t.Fatal(err)
	}
	if err := RecordEnd(dir, guestabi.EndShutdown); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(end); err != nil || !guestabi.Shutdown(b) {
		t.Errorf("recorded %q, %v; want a shutdown", b, err)
	}
	if b, _ := os.ReadFile(target); string(b) != "untouched" {
		t.Errorf("the link's target was written: %q", b)
	}
	if err := RecordEnd(dir, guestabi.EndReset); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(end); err != nil || guestabi.Shutdown(b) || string(b) != guestabi.EndReset+"\n" {
		t.Errorf("recorded %q, %v; want a reset", b, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the directory holds %v", ents)
	}

	// A directory planted at the name: the end is not recorded, which
	// the host reads as a reset.
	planted := t.TempDir()
	if err := os.Mkdir(filepath.Join(planted, guestabi.EndFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := RecordEnd(planted, guestabi.EndShutdown); err == nil {
		t.Error("recorded over a directory")
	}
	if ents, _ := os.ReadDir(planted); len(ents) != 1 {
		t.Errorf("a failed record left %v", ents)
	}
}
