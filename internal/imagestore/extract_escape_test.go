package imagestore

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestExtractDoesNotTouchTimesOutsideTheLayer: a directory that a later
// entry replaces with a symlink out of the layer keeps the host's times.
func TestExtractDoesNotTouchTimesOutsideTheLayer(t *testing.T) {
	outside := t.TempDir()
	if err := os.Mkdir(filepath.Join(outside, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	old := time.Unix(0, 0)
	for _, h := range []*tar.Header{
		{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: old},
		{Name: "a/x/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: old},
		{Name: "a", Typeflag: tar.TypeSymlink, Linkname: outside, ModTime: old},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	if _, err := extractLayer(tar.NewReader(&buf), t.TempDir(), DefaultMaxLayerBytes); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(outside, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.ModTime().Before(time.Now().Add(-time.Hour)) {
		t.Errorf("a directory outside the layer got the image's time %v", fi.ModTime())
	}
}
