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

// TestScanAdmitsWhatExtractAdmits: a layer whose entries replace one
// another (a symlink by a directory, a directory by a file, a whiteout)
// and hard-link earlier files passes the import's scan as it unpacks.
func TestScanAdmitsWhatExtractAdmits(t *testing.T) {
	entries := []tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "a", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
		{Name: "a", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "a/f", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "a/g", Typeflag: tar.TypeLink, Linkname: "a/f"},
		{Name: "d/e", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "d", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: ".wh.d", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "d", Typeflag: tar.TypeSymlink, Linkname: "a"},
		{Name: "a/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "p", Typeflag: tar.TypeFifo, Mode: 0o644},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	if err := scanLayer(tar.NewReader(bytes.NewReader(buf.Bytes())), 1<<20); err != nil {
		t.Errorf("scan: %v", err)
	}
	if os.Geteuid() == 0 {
		if _, err := extractLayer(tar.NewReader(bytes.NewReader(buf.Bytes())), t.TempDir(), 1<<20); err != nil {
			t.Errorf("extract: %v", err)
		}
	}
}
