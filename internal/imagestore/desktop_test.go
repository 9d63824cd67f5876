package imagestore

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestWriteLayer: mmdebstrap's tar becomes a layer without "./", without
// the root's own entry and without device nodes; hard links follow.
func TestWriteLayer(t *testing.T) {
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "./dev/sda", Typeflag: tar.TypeBlock, Mode: 0o660, Devmajor: 8},
		{Name: "./dev/fd", Typeflag: tar.TypeSymlink, Linkname: "/proc/self/fd"},
		{Name: "./usr/bin/x", Typeflag: tar.TypeReg, Mode: 0o755, Size: 3},
		{Name: "./usr/bin/y", Typeflag: tar.TypeLink, Linkname: "./usr/bin/x"},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("abc"))
		}
	}
	tw.Close()
	path := filepath.Join(t.TempDir(), "layer.tar.gz")
	if err := writeLayer(&in, path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var got []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.Name+">"+h.Linkname)
		if h.Name == "usr/bin/x" {
			if b, _ := io.ReadAll(tr); string(b) != "abc" {
				t.Errorf("usr/bin/x holds %q", b)
			}
		}
	}
	want := []string{"dev/>", "dev/fd>/proc/self/fd", "usr/bin/x>", "usr/bin/y>usr/bin/x"}
	if !slices.Equal(got, want) {
		t.Errorf("layer entries %q, want %q", got, want)
	}
}

func TestDesktopCache(t *testing.T) {
	cache := t.TempDir()
	dir := DesktopImageDir(cache)
	if filepath.Dir(dir) != cache || !strings.HasPrefix(filepath.Base(dir), "desktop-") || DesktopImageDir(cache) != dir {
		t.Fatalf("DesktopImageDir = %s", dir)
	}
	if _, err := DesktopImage(cache); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DesktopImage of an empty cache: %v, want os.ErrNotExist", err)
	}
	// An earlier recipe's image goes once the current one is built; a
	// build in progress and other files stay.
	stale := filepath.Join(cache, "desktop-0123456789abcdef")
	building := filepath.Join(cache, "desktop-0123456789abcdef.tmp-1")
	for _, d := range []string{stale, building, dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "index.json"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(stale+".lock", nil, 0o644)
	removeStaleDesktops(cache, dir)
	for d, kept := range map[string]bool{stale: false, stale + ".lock": false, building: true, dir: true} {
		if _, err := os.Stat(d); (err == nil) != kept {
			t.Errorf("%s: kept %v, want %v", d, err == nil, kept)
		}
	}
}
