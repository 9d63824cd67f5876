package artifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// fakeImage returns the blobs of an image (manifest first) by digest.
func fakeImage() (order []string, blobs map[string][]byte) {
	config := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:` + strings.Repeat("1", 64) + `"]}}`)
	layer := bytes.Repeat([]byte("layer bytes "), 1000)
	m := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",`+
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":%q,"size":%d},`+
		`"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":%q,"size":%d}]}`,
		digest(config), len(config), digest(layer), len(layer))
	blobs = map[string][]byte{digest([]byte(m)): []byte(m), digest(config): config, digest(layer): layer}
	return []string{digest([]byte(m)), digest(config), digest(layer)}, blobs
}

// writeWithTemplate writes an artifact carrying the image of order,
// whose content open gives.
func writeWithTemplate(t *testing.T, m *ctrlv1.TransferManifest, order []string, open OpenBlob) []byte {
	t.Helper()
	return writeWith(t, m, func(w *Writer) {
		if order != nil {
			must(t, w.AddTemplate(order, open))
		}
	})
}

func opener(blobs map[string][]byte) OpenBlob {
	return func(d string) (io.ReadCloser, int64, error) {
		b, ok := blobs[d]
		if !ok {
			return nil, 0, os.ErrNotExist
		}
		return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
	}
}

// TestTemplateSection carries an image as an OCI layout, and refuses a
// blob that is not what its digest names, a section the manifest does not
// declare, and a declared one that is missing or incomplete.
func TestTemplateSection(t *testing.T) {
	hosttest.RequireRoot(t)
	order, blobs := fakeImage()
	m := proto.CloneOf(manifest)
	m.CarriesTemplate, m.TemplateImageDigest = true, order[0]
	art := writeWithTemplate(t, m, order, opener(blobs))
	dir := t.TempDir()
	got, err := Extract(context.Background(), bytes.NewReader(art), map[string]string{Template: dir})
	must(t, err)
	if !proto.Equal(got, m) {
		t.Errorf("manifest = %v", got)
	}
	for d, b := range blobs {
		if data, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))); err != nil || !bytes.Equal(data, b) {
			t.Errorf("blob %s: %v", d, err)
		}
	}
	index, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil || !strings.Contains(string(index), order[0]) {
		t.Errorf("index.json = %s, %v", index, err)
	}

	// A blob whose content is not its digest's, the trailer summing what
	// was written.
	forged := map[string][]byte{}
	for d, b := range blobs {
		forged[d] = b
	}
	forged[order[2]] = bytes.Repeat([]byte("evil bytes! "), 1000)
	notDeclared := proto.CloneOf(m)
	notDeclared.CarriesTemplate = false
	otherImage := proto.CloneOf(m)
	otherImage.TemplateImageDigest = "sha256:" + strings.Repeat("a", 64)
	for _, c := range []struct {
		name, says string
		art        []byte
	}{
		{"a forged blob", "does not hold what its digest names", writeWithTemplate(t, m, order, opener(forged))},
		{"an undeclared section", "does not declare", writeWithTemplate(t, notDeclared, order, opener(blobs))},
		{"a missing section", "missing or incomplete", writeWithTemplate(t, m, nil, nil)},
		{"a missing layer", "does not hold", writeWithTemplate(t, m, order[:2], opener(blobs))},
		{"another image", "is not the image's manifest", writeWithTemplate(t, otherImage, order, opener(blobs))},
	} {
		_, err := Walk(context.Background(), bytes.NewReader(c.art), nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an invalid artifact saying %q", c.name, err, c.says)
		}
	}
}

// TestTemplateSectionHoldsOnlyTheImage: a template section is refused,
// before the content of the entry at fault is read or extracted, when it
// holds a blob the image does not name (an extra 64 MiB of zeros, or 3 GiB
// in a 7 MiB artifact, was written out in full at a restore), a blob of
// another size than its descriptor declares, or an image that declares
// more than maxTemplateBytes.
func TestTemplateSectionHoldsOnlyTheImage(t *testing.T) {
	hosttest.RequireRoot(t)
	order, blobs := fakeImage()
	zeros := make([]byte, 64<<20)
	blobs[digest(zeros)] = zeros
	config, layer := blobs[order[1]], blobs[order[2]]
	// withManifest returns the image of a manifest naming config and
	// layer with these sizes, and its blobs.
	withManifest := func(configSize, layerSize int64) ([]string, map[string][]byte) {
		m := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",`+
			`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":%q,"size":%d},`+
			`"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":%q,"size":%d}]}`,
			order[1], configSize, order[2], layerSize)
		b := map[string][]byte{digest([]byte(m)): []byte(m), order[1]: config, order[2]: layer}
		return []string{digest([]byte(m)), order[1], order[2]}, b
	}
	wrongSize, wrongSizeBlobs := withManifest(int64(len(config)), int64(len(layer))+1)
	tooBig, tooBigBlobs := withManifest(int64(len(config)), maxTemplateBytes)
	for _, c := range []struct {
		name, says string
		// image is the manifest's template_image_digest; the section
		// holds the blobs of order (AddTemplate takes the first for the
		// image manifest).
		image string
		order []string
		blobs map[string][]byte
	}{
		{"an extra blob", "is not one the image's manifest names", order[0], append(slices.Clone(order), digest(zeros)), blobs},
		{"a blob before the image's manifest", "is not the image's manifest", order[0], order[1:], blobs},
		{"a layer of another size", "the image's manifest says", wrongSize[0], wrongSize, wrongSizeBlobs},
		{"an image over the bound", "declares more than", tooBig[0], tooBig, tooBigBlobs},
	} {
		m := proto.CloneOf(manifest)
		m.CarriesTemplate, m.TemplateImageDigest = true, c.image
		art := writeWith(t, m, func(w *Writer) { must(t, w.AddTemplate(c.order, opener(c.blobs))) })
		dir := t.TempDir()
		_, err := Extract(context.Background(), bytes.NewReader(art), map[string]string{Template: dir})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an invalid artifact saying %q", c.name, err, c.says)
			continue
		}
		t.Logf("%s: %v", c.name, err)
		if _, err := os.Stat(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(digest(zeros), "sha256:"))); err == nil {
			t.Errorf("%s: the blob not named was extracted", c.name)
		}
	}
}
