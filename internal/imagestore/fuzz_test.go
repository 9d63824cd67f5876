package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The fuzz targets feed untrusted bytes to every parser of the package. Seeds
// are in testdata/fuzz/<target>; `go test` runs only them. Each checks that
// the input is taken or refused as a whole: no panic, nothing half stored,
// nothing written outside its root.

// FuzzImportArchive: a `docker save` archive.
func FuzzImportArchive(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		s := openStore(t)
		if _, err := s.ImportArchive(context.Background(), bytes.NewReader(data)); err != nil {
			assertClean(t, s)
		}
	})
}

// FuzzImportOCILayoutTar: a tar of an OCI image layout.
func FuzzImportOCILayoutTar(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		s := openStore(t)
		if _, err := s.ImportOCILayoutTar(context.Background(), bytes.NewReader(data)); err != nil {
			assertClean(t, s)
		}
	})
}

// FuzzExtractLayer: a layer's tar, extracted as Unpack does, with a small
// size limit.
func FuzzExtractLayer(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		root := filepath.Join(parent, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := extractLayer(tar.NewReader(bytes.NewReader(data)), root, 1<<20)
		if errors.Is(err, ErrLayerTooLarge) && !errors.Is(err, ErrInvalidImage) {
			t.Errorf("ErrLayerTooLarge without ErrInvalidImage: %v", err)
		}
		if names := dirEntries(t, parent); !slices.Equal(names, []string{"root"}) {
			t.Errorf("extraction wrote outside its root: %v", names)
		}
		// What import's scan refuses, extraction never takes.
		if scanErr := scanLayer(tar.NewReader(bytes.NewReader(data)), 1<<20); err == nil && scanErr != nil {
			t.Errorf("extraction took a layer the scan refuses: %v", scanErr)
		}
	})
}
