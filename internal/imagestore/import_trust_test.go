package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// archiveFile is one file of a hand-written `docker save` archive.
type archiveFile struct {
	name string
	data []byte
}

// dockerSave writes a `docker save` archive of one image from its parts, as
// an attacker may: the layers named in manifest.json, optional LayerSources.
func dockerSave(t *testing.T, config []byte, layers []archiveFile, sources map[v1.Hash]v1.Descriptor) []byte {
	t.Helper()
	var names []string
	for _, l := range layers {
		names = append(names, l.name)
	}
	manifest, err := json.Marshal([]map[string]any{{
		"Config": "config.json", "RepoTags": []string{"kibotos.test/x:latest"},
		"Layers": names, "LayerSources": sources,
	}})
	if err != nil {
		t.Fatal(err)
	}
	files := append([]archiveFile{{"manifest.json", manifest}, {"config.json", config}}, layers...)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	written := map[string]bool{}
	for _, f := range files {
		if written[f.name] {
			continue
		}
		written[f.name] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layerParts returns a layer's compressed bytes, digest and DiffID.
func layerParts(t *testing.T, l v1.Layer) (data []byte, digest, diffID v1.Hash, mediaType string) {
	t.Helper()
	rc := must(l.Compressed())(t)
	defer rc.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(rc); err != nil {
		t.Fatal(err)
	}
	mt := must(l.MediaType())(t)
	return buf.Bytes(), must(l.Digest())(t), must(l.DiffID())(t), string(mt)
}

func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// configWith is a linux/amd64 image config whose rootfs lists diffIDs.
func configWith(t *testing.T, env string, diffIDs ...v1.Hash) []byte {
	t.Helper()
	cf := v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: v1.Config{Env: []string{env}}}
	cf.RootFS.Type = "layers"
	cf.RootFS.DiffIDs = diffIDs
	b, err := json.Marshal(cf)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestImportNeverGainsAnUnsentLayer: an image naming a layer the store
// already holds, without carrying that layer's bytes, is refused and
// stores nothing, however it names it.
func TestImportNeverGainsAnUnsentLayer(t *testing.T) {
	ctx := context.Background()
	secret := tarLayer(t, fileE("secret", "another project's file"))
	secretData, secretDigest, secretDiffID, secretType := layerParts(t, secret)
	own := tarLayer(t, fileE("mine", "the attacker's own file"))
	ownData, _, ownDiffID, _ := layerParts(t, own)
	decoy := []byte("not the layer")

	cases := []struct {
		name    string
		archive func(t *testing.T) []byte
	}{
		{"LayerSources names the stored layer, with a decoy", func(t *testing.T) []byte {
			return dockerSave(t, configWith(t, "X=1", secretDiffID), []archiveFile{{"decoy.tar", decoy}},
				map[v1.Hash]v1.Descriptor{secretDiffID: {MediaType: "application/vnd.docker.image.rootfs.diff.tar.gzip",
					Digest: secretDigest, Size: int64(len(secretData))}})
		}},
		{"own layer claimed as the stored layer's DiffID", func(t *testing.T) []byte {
			return dockerSave(t, configWith(t, "X=2", secretDiffID), []archiveFile{{"own.tar.gz", ownData}}, nil)
		}},
		{"own layer listed twice with two DiffIDs", func(t *testing.T) []byte {
			return dockerSave(t, configWith(t, "X=3", ownDiffID, secretDiffID),
				[]archiveFile{{"own.tar.gz", ownData}, {"own.tar.gz", ownData}}, nil)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t)
			// The victim's layer is in the store, and the attacker's own too.
			victim := must(s.ImportArchive(ctx, bytes.NewReader(dockerSave(t, configWith(t, "V=1", secretDiffID),
				[]archiveFile{{"secret.tar.gz", secretData}}, nil))))(t)
			if victim.Layers[0].Digest != secretDigest.String() || secretType == "" {
				t.Fatalf("victim's image has layers %v", victim.Layers)
			}
			mine := must(s.ImportArchive(ctx, bytes.NewReader(dockerSave(t, configWith(t, "O=1", ownDiffID),
				[]archiveFile{{"own.tar.gz", ownData}}, nil))))(t)
			before := dirEntries(t, s.blobDir())

			img, err := s.ImportArchive(ctx, bytes.NewReader(c.archive(t)))
			if !errors.Is(err, ErrDigestMismatch) && !errors.Is(err, ErrInvalidImage) {
				t.Fatalf("crafted import: %v (image %+v), want a digest mismatch or invalid image", err, img)
			}
			if !strings.Contains(err.Error(), "layer sha256:") {
				t.Errorf("error %q does not name the layer", err)
			}
			if after := dirEntries(t, s.blobDir()); !slices.Equal(before, after) {
				t.Errorf("blobs changed from %v to %v", before, after)
			}
			if names := dirEntries(t, s.tmpDir()); len(names) != 0 {
				t.Errorf("tmp holds %v", names)
			}
			// Importing the same images again in full still works.
			again := must(s.ImportArchive(ctx, bytes.NewReader(dockerSave(t, configWith(t, "O=1", ownDiffID),
				[]archiveFile{{"own.tar.gz", ownData}}, nil))))(t)
			if again.ManifestDigest != mine.ManifestDigest {
				t.Errorf("re-import is %s, first import %s", again.ManifestDigest, mine.ManifestDigest)
			}
		})
	}
}
