package templates_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestImportCannotBorrowAnotherProjectsLayer: project B uploads a
// `docker save` archive whose manifest.json names project A's layer in
// LayerSources and carries only a decoy. The import is refused
// (invalid_argument naming the layer) and stores nothing; B's upload of
// the whole image still works.
func TestImportCannotBorrowAnotherProjectsLayer(t *testing.T) {
	e := newEnv(t, testutil.SQLiteStore(t))
	a, b := e.client(projectA), e.client(projectB)
	e.create(a, "secret", nil)
	e.create(b, "thief", nil)
	victim := randomImage(t)
	if _, err := upload(a, "a-1", "secret", tarballFormat, dockerArchive(t, victim), false); err != nil {
		t.Fatal(err)
	}
	layer := must(victim.Layers())(t, "layers")[0]
	digest := must(layer.Digest())(t, "digest")
	diffID := must(layer.DiffID())(t, "diff id")
	size := must(layer.Size())(t, "size")
	mediaType := must(layer.MediaType())(t, "media type")

	cf := must(victim.ConfigFile())(t, "config").DeepCopy()
	cf.RootFS.DiffIDs = []v1.Hash{diffID}
	cf.Config.Env = []string{"STOLEN=1"}
	config := must(json.Marshal(cf))(t, "config")
	manifest := must(json.Marshal([]map[string]any{{
		"Config": "config.json", "RepoTags": []string{"kibotos.test/thief:latest"}, "Layers": []string{"decoy.tar"},
		"LayerSources": map[v1.Hash]v1.Descriptor{diffID: {MediaType: mediaType, Digest: digest, Size: size}},
	}}))(t, "manifest")
	var crafted bytes.Buffer
	tw := tar.NewWriter(&crafted)
	for _, f := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {"config.json", config}, {"decoy.tar", []byte("a decoy, not the layer")}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}

	blobs := func() []string {
		ents := must(os.ReadDir(e.images.Dir()+"/blobs/sha256"))(t, "blobs")
		var names []string
		for _, d := range ents {
			names = append(names, d.Name())
		}
		return names
	}
	before := blobs()
	_, err := upload(b, "b-1", "thief", tarballFormat, crafted.Bytes(), false)
	wantCode(t, "import naming another project's layer", err, connect.CodeInvalidArgument)
	if err != nil && !strings.Contains(err.Error(), digest.String()) {
		t.Errorf("error %q does not name the layer %s", err, digest)
	}
	if after := blobs(); !slices.Equal(before, after) {
		t.Errorf("blobs changed from %v to %v", before, after)
	}
	ctx := context.Background()
	err = e.st.View(ctx, func(tx store.Tx) error {
		revs, err := tx.TemplateRevisions(ctx, projectB, "thief")
		if err == nil && len(revs) != 0 {
			t.Errorf("thief has revisions %v", revs)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	// The whole image, uploaded by B, is B's to use.
	if _, err := upload(b, "b-2", "thief", tarballFormat, dockerArchive(t, victim), false); err != nil {
		t.Fatalf("a full upload of the same image: %v", err)
	}
	if _, err := upload(a, "a-2", "secret", tarballFormat, dockerArchive(t, victim), false); err != nil {
		t.Fatalf("a re-import: %v", err)
	}
}
