package agent

import (
	"path/filepath"
	"testing"
)

func TestSameFilesystem(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{filepath.Join(dir, "."), dir, true},
		{dir, t.TempDir(), true}, // both under the same temporary directory
		{dir, "/proc", false},
		{dir, filepath.Join(dir, "missing"), false},
	} {
		if got := sameFilesystem(c.a, c.b); got != c.want {
			t.Errorf("sameFilesystem(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
