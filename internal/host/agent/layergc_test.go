package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// TestCollectLayers: the host removes an unpacked layer once no execution
// here uses it and ctrl has removed its blob, never one an execution uses,
// and nothing while an execution's assignment is unknown.
func TestCollectLayers(t *testing.T) {
	ctx := context.Background()
	images, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	importImage := func() imagestore.Image {
		img, err := random.Image(1024, 1)
		if err != nil {
			t.Fatal(err)
		}
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", "amd64"
		img, err = mutate.ConfigFile(img, cf)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := tarball.Write(name.MustParseReference("kibotos.test/x:1"), img, &buf); err != nil {
			t.Fatal(err)
		}
		stored, err := images.ImportArchive(ctx, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := images.Unpack(ctx, stored, nil); err != nil {
			t.Fatal(err)
		}
		return stored
	}
	used, unused := importImage(), importImage()
	// ctrl removed both images' blobs (their templates were deleted).
	if _, err := images.RemoveBlobs(nil, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	layerPath := func(img imagestore.Image) string {
		return filepath.Join(images.Dir(), "layers", "sha256", img.Layers[0].DiffID[len("sha256:"):])
	}
	assignment := func(img imagestore.Image) *hostv1.Assignment {
		return &hostv1.Assignment{Template: &hostv1.ExecutionTemplate{Layers: []*hostv1.TemplateLayer{
			{Digest: img.Layers[0].Digest, DiffId: img.Layers[0].DiffID}}}}
	}
	a := &Agent{cfg: Config{Template: images}, execs: map[string]*execution{
		"running": {desired: assignment(used), known: true},
		"adopted": {},
	}}
	later := time.Now().Add(time.Hour) // every layer counts as handed out before it

	a.collectLayersOnce(later)
	for _, img := range []imagestore.Image{used, unused} {
		if _, err := os.Stat(layerPath(img)); err != nil {
			t.Errorf("a layer was removed while an execution's assignment is unknown: %v", err)
		}
	}

	a.execs["adopted"].desired, a.execs["adopted"].known = assignment(used), true
	a.collectLayersOnce(later)
	if _, err := os.Stat(layerPath(used)); err != nil {
		t.Errorf("the layer an execution uses was removed: %v", err)
	}
	if _, err := os.Stat(layerPath(unused)); !os.IsNotExist(err) {
		t.Errorf("the unused layer whose blob is gone stays (%v)", err)
	}
}
