package testutil

import (
	"archive/tar"
	"bytes"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kibotos/kibotos/internal/imagestore"
)

// HelloImageArchive writes, as `docker save` does, HelloImage(content)
// and returns the archive's path: an image a deployment lacks until it
// imports it, on which a workspace runs.
func HelloImageArchive(t testing.TB, content string) string {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(archive, name.MustParseReference("example.com/hello:1"), HelloImage(t, content)); err != nil {
		t.Fatal(err)
	}
	return archive
}

// HelloImage is the built-in image (of the host's busybox) with one more
// layer holding /hello.txt with content.
func HelloImage(t testing.TB, content string) v1.Image {
	t.Helper()
	base, err := imagestore.BuiltinImage(imagestore.DefaultBusybox)
	if err != nil {
		t.Fatal(err)
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
	tw.Write([]byte(content))
	tw.Close()
	layer, err := tarball.LayerFromReader(bytes.NewReader(layerTar.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
