package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// bigDocument is the size of the oversized documents below: far over
// maxConfigBytes, and far over what refusing one may allocate.
const bigDocument = 64 << 20

// refusedSmall fails the test unless import is refused as an invalid image
// whose message has says, having allocated less than half of bigDocument.
func refusedSmall(t *testing.T, what, says string, imp func() error) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := imp()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: %v, want an invalid image saying %q", what, err, says)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > bigDocument/2 {
		t.Errorf("%s: refusing it allocated %d bytes", what, alloc)
	}
}

// rewriteEntry returns the tar archive with the entry name changed by
// change, which writes what stands in its place to tw.
func rewriteEntry(t *testing.T, archive []byte, name string, change func(tw *tar.Writer, hdr *tar.Header, data []byte)) []byte {
	t.Helper()
	var out bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(archive)), tar.NewWriter(&out)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name == name {
			change(tw, hdr, data)
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// writeEntry writes one entry to tw.
func writeEntry(t *testing.T, tw *tar.Writer, hdr *tar.Header, data []byte) {
	t.Helper()
	if err := tw.WriteHeader(hdr); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
}

// withBody returns the tar archive with the body of the entry name
// replaced.
func withBody(t *testing.T, archive []byte, name string, body []byte) []byte {
	return rewriteEntry(t, archive, name, func(tw *tar.Writer, hdr *tar.Header, _ []byte) {
		hdr.Size = int64(len(body))
		writeEntry(t, tw, hdr, body)
	})
}

// linkChain returns the tar archive with the entry name moved to the end
// of a chain of n symlinks, named name, name.1, ... name.(n-1).
func linkChain(t *testing.T, archive []byte, name string, n int) []byte {
	return rewriteEntry(t, archive, name, func(tw *tar.Writer, hdr *tar.Header, data []byte) {
		from := name
		for i := range n {
			to := fmt.Sprintf("%s.%d", name, i+1)
			writeEntry(t, tw, &tar.Header{Name: from, Typeflag: tar.TypeSymlink, Linkname: to, Mode: 0o644}, nil)
			from = to
		}
		hdr.Name = from
		writeEntry(t, tw, hdr, data)
	})
}

// declaredConfig is an image whose manifest declares a config of another
// size, as a registry's may; it records whether its config was read.
type declaredConfig struct {
	v1.Image
	manifest []byte
	read     *bool
}

func (d declaredConfig) RawManifest() ([]byte, error) { return d.manifest, nil }

func (d declaredConfig) RawConfigFile() ([]byte, error) {
	*d.read = true
	return d.Image.RawConfigFile()
}

// TestDocumentsReadWholeAreBounded: an image's documents that are read
// whole (the config, an archive's manifest.json, a layout's index, manifest
// and config) are refused when over the bound before they are read, so a
// tenant's import cannot make the control plane hold gigabytes; and a
// layout's document that is not what its descriptor names is refused.
func TestDocumentsReadWholeAreBounded(t *testing.T) {
	ctx := context.Background()
	src := twoLayerImage(t)
	rawConfig, err := src.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	// Still JSON, and the same config: blanks before its closing brace.
	padded := append(append(bytes.Clone(rawConfig[:len(rawConfig)-1]), bytes.Repeat([]byte(" "), bigDocument)...), '}')

	// An archive's config, which tarball reads before its size is known.
	archive := writeArchive(t, src)
	var manifests []struct{ Config string }
	tr := tar.NewReader(bytes.NewReader(archive))
	for hdr, err := tr.Next(); err == nil; hdr, err = tr.Next() {
		if hdr.Name == "manifest.json" {
			if err := json.NewDecoder(tr).Decode(&manifests); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(manifests) != 1 {
		t.Fatalf("the archive's manifest.json lists %d images", len(manifests))
	}
	path := filepath.Join(t.TempDir(), "big-config.tar")
	if err := os.WriteFile(path, withBody(t, archive, manifests[0].Config, padded), 0o644); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	refusedSmall(t, "an archive's config", "its config is", func() error { _, err := s.ImportArchiveFile(ctx, path); return err })

	// A config a registry declares over the bound is not fetched.
	m, err := src.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	m.Config.Size = 1 << 30
	declared, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	read := false
	refusedSmall(t, "a declared config", "its config is 1073741824 bytes", func() error {
		_, err := s.ImportImage(ctx, declaredConfig{src, declared, &read})
		return err
	})
	// -1: a size not declared, which go-containerregistry reads to the end.
	m.Config.Size = -1
	if declared, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	refusedSmall(t, "a config of no declared size", "its config is -1 bytes", func() error {
		_, err := s.ImportImage(ctx, declaredConfig{src, declared, &read})
		return err
	})
	if read {
		t.Error("a config a registry declared over the bound, or not at all, was read")
	}

	// A config reached through more links than are followed.
	linked := filepath.Join(t.TempDir(), "linked-config.tar")
	if err := os.WriteFile(linked, linkChain(t, archive, manifests[0].Config, maxLinks+1), 0o644); err != nil {
		t.Fatal(err)
	}
	refusedSmall(t, "a config through too many links", "more than 16 links", func() error { _, err := s.ImportArchiveFile(ctx, linked); return err })

	// A layout's manifest not what index.json names, and its config over
	// the bound.
	layoutOf := func() (dir string, manifest, config string) {
		dir = t.TempDir()
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.AppendImage(src, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
			t.Fatal(err)
		}
		md, _ := src.Digest()
		cd, _ := src.ConfigName()
		return dir, filepath.Join(dir, "blobs", "sha256", md.Hex), filepath.Join(dir, "blobs", "sha256", cd.Hex)
	}
	dir, manifest, _ := layoutOf()
	raw, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, append(raw, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ImportLayoutDir(ctx, dir); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "the manifest named") {
		t.Errorf("a layout's manifest not what its index names: %v", err)
	}
	dir, _, config := layoutOf()
	if err := os.WriteFile(config, padded, 0o644); err != nil {
		t.Fatal(err)
	}
	refusedSmall(t, "a layout's config", "at most", func() error { _, err := s.ImportLayoutDir(ctx, dir); return err })
}
