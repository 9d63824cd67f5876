package artifact

import (
	"archive/tar"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// The template section carries the Template revision's image when the
// manifest says carries_template: an OCI image layout whose only image is
// the one of manifest.template_image_digest. Its entries, in this order:
// template, template/blobs, template/blobs/sha256 (directories),
// template/oci-layout, template/blobs/sha256/<hex> for the image manifest,
// its config and its layers, then template/index.json. Walk checks that
// every blob hashes to its name, that index.json names exactly the image
// of the manifest, and that the blobs are exactly those the image
// manifest names (it first, of at most maxImageMeta bytes), each of the
// size its descriptor declares, at most maxTemplateBytes in all, each
// refused before its content is read; a section without carries_template,
// or carries_template without a whole section, is refused.

// Names inside the template section.
const (
	layoutName   = "oci-layout"
	indexName    = "index.json"
	blobsRel     = "blobs/sha256"
	layoutBody   = `{"imageLayoutVersion":"1.0.0"}`
	ociManifest  = "application/vnd.oci.image.manifest.v1+json"
	maxImageMeta = 4 << 20 // bound of an image manifest or index.json
	// maxTemplateBytes bounds the blobs of a carried image, as their
	// descriptors declare them: a restore writes them out before the
	// image store reads them. Above the 8 GiB an import of a template
	// revision takes by default, so that one a deployment took with a
	// raised bound still travels.
	maxTemplateBytes = 64 << 30
)

var blobRel = regexp.MustCompile(`^blobs/sha256/([0-9a-f]{64})$`)

// imageManifest is what the format reads of an OCI or Docker image
// manifest.
type imageManifest struct {
	MediaType string       `json:"mediaType"`
	Config    descriptor   `json:"config"`
	Layers    []descriptor `json:"layers"`
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

type imageIndex struct {
	SchemaVersion int          `json:"schemaVersion"`
	Manifests     []descriptor `json:"manifests"`
}

// OpenBlob opens one blob of the carried image by digest (sha256:<hex>),
// returning its content and size.
type OpenBlob func(digest string) (io.ReadCloser, int64, error)

// AddTemplate adds the template section: the image whose manifest is
// blobs[0], then its other blobs (its config and layers) in order, each
// read through open.
func (w *Writer) AddTemplate(blobs []string, open OpenBlob) error {
	if len(blobs) == 0 {
		return fmt.Errorf("artifact: a template needs its image manifest")
	}
	for _, dir := range []string{Template, Template + "/blobs", Template + "/" + blobsRel} {
		if err := w.addDir(dir); err != nil {
			return err
		}
	}
	if err := w.AddFile(Template+"/"+layoutName, strings.NewReader(layoutBody), int64(len(layoutBody))); err != nil {
		return err
	}
	var index descriptor
	for i, digest := range blobs {
		hexDigest, ok := strings.CutPrefix(digest, "sha256:")
		if !ok || !blobRel.MatchString("blobs/sha256/"+hexDigest) {
			return fmt.Errorf("artifact: template blob %q is not sha256:<hex>", digest)
		}
		rc, size, err := open(digest)
		if err != nil {
			return fmt.Errorf("artifact: template blob %s: %w", digest, err)
		}
		var r io.Reader = rc
		if i == 0 {
			raw, err := io.ReadAll(io.LimitReader(rc, maxImageMeta+1))
			if err != nil || len(raw) > maxImageMeta {
				rc.Close()
				return fmt.Errorf("artifact: image manifest %s: %d bytes read: %v", digest, len(raw), err)
			}
			var m imageManifest
			if err := json.Unmarshal(raw, &m); err != nil {
				rc.Close()
				return fmt.Errorf("artifact: image manifest %s: %w", digest, err)
			}
			index = descriptor{MediaType: m.MediaType, Digest: digest, Size: int64(len(raw))}
			if index.MediaType == "" {
				index.MediaType = ociManifest
			}
			r, size = bytes.NewReader(raw), int64(len(raw))
		}
		err = w.AddFile(Template+"/"+blobsRel+"/"+hexDigest, r, size)
		rc.Close()
		if err != nil {
			return err
		}
	}
	body, err := json.Marshal(imageIndex{SchemaVersion: 2, Manifests: []descriptor{index}})
	if err != nil {
		return err
	}
	return w.AddFile(Template+"/"+indexName, bytes.NewReader(body), int64(len(body)))
}

// addDir adds a directory entry (mode 0755, owned by root).
func (w *Writer) addDir(name string) error {
	w.entries++
	return w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, Format: tar.FormatPAX, ModTime: time.Unix(0, 0)})
}

// templateCheck follows the template section while Walk reads it.
type templateCheck struct {
	// manifestHex is the hex of the image manifest's digest.
	manifestHex string
	// named are the sizes of the blobs that may come, by hex digest: the
	// image manifest's (unknown, -1) until it came, then those it names.
	named map[string]int64
	// blobs are those that came.
	blobs  map[string]bool
	layout bool
	index  []byte
}

func newTemplateCheck(m *ctrlv1.TransferManifest) *templateCheck {
	if !m.GetCarriesTemplate() {
		return nil
	}
	h := strings.TrimPrefix(m.GetTemplateImageDigest(), "sha256:")
	return &templateCheck{manifestHex: h, named: map[string]int64{h: -1}, blobs: map[string]bool{}}
}

// admit checks an entry of the template section before its content is
// read, and returns where its content is kept (nil for none).
func (c *templateCheck) admit(e *Entry) (*bytes.Buffer, error) {
	if c == nil {
		return nil, invalid("it carries a template section its manifest does not declare")
	}
	dir := e.Header.Typeflag == tar.TypeDir
	switch rel := e.Rel; {
	case rel == "" || rel == "blobs" || rel == blobsRel:
		if !dir {
			return nil, invalid("template entry %s is not a directory", e.Header.Name)
		}
		return nil, nil
	case rel == layoutName || rel == indexName || blobRel.MatchString(rel):
	default:
		return nil, invalid("template entry %s is not part of an OCI image layout", e.Header.Name)
	}
	if e.Header.Typeflag != tar.TypeReg || len(e.Extents) > 1 || e.Size != e.Header.Size {
		return nil, invalid("template entry %s is not a plain regular file", e.Header.Name)
	}
	if name, ok := strings.CutPrefix(e.Rel, blobsRel+"/"); ok {
		size, named := c.named[name]
		switch {
		case c.blobs[name]:
			return nil, invalid("template blob sha256:%s comes twice", name)
		case !named && c.blobs[c.manifestHex]:
			return nil, invalid("template blob sha256:%s is not one the image's manifest names", name)
		case !named:
			return nil, invalid("template blob sha256:%s is not the image's manifest sha256:%s, which comes first", name, c.manifestHex)
		case size >= 0 && e.Size != size:
			return nil, invalid("template blob sha256:%s is %d bytes; the image's manifest says %d", name, e.Size, size)
		case name != c.manifestHex:
			return nil, nil
		}
	}
	// The image manifest, oci-layout and index.json are read whole.
	if e.Size > maxImageMeta {
		return nil, invalid("template entry %s is %d bytes, more than %d", e.Header.Name, e.Size, maxImageMeta)
	}
	return new(bytes.Buffer), nil
}

// done records an entry whose content summed to sum, kept in kept.
func (c *templateCheck) done(e *Entry, sum []byte, kept *bytes.Buffer) error {
	switch {
	case e.Rel == layoutName:
		c.layout = true
	case e.Rel == indexName:
		c.index = kept.Bytes()
	case blobRel.MatchString(e.Rel):
		name := strings.TrimPrefix(e.Rel, blobsRel+"/")
		if got := hex.EncodeToString(sum); got != name {
			return invalid("template blob sha256:%s does not hold what its digest names: its content is sha256:%s", name, got)
		}
		c.blobs[name] = true
		if name == c.manifestHex {
			return c.nameBlobs(kept.Bytes())
		}
	}
	return nil
}

// nameBlobs takes the blobs the image manifest raw names, config and
// layers, as the ones that may follow it.
func (c *templateCheck) nameBlobs(raw []byte) error {
	var m imageManifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return invalid("the template's image manifest does not parse: %v", err)
	}
	c.named[c.manifestHex] = int64(len(raw))
	total := int64(len(raw))
	for _, d := range append([]descriptor{m.Config}, m.Layers...) {
		h, ok := strings.CutPrefix(d.Digest, "sha256:")
		if !ok || !blobRel.MatchString(blobsRel+"/"+h) {
			return invalid("the template's image names blob %q, which is not sha256:<hex>", d.Digest)
		}
		if size, seen := c.named[h]; seen {
			if size != d.Size {
				return invalid("the template's image names blob %s with sizes %d and %d", d.Digest, size, d.Size)
			}
			continue // a layer named twice is carried once
		}
		if d.Size < 0 || d.Size > maxTemplateBytes-total {
			return invalid("the template's image declares more than %d bytes of blobs (blob %s of %d bytes)", int64(maxTemplateBytes), d.Digest, d.Size)
		}
		c.named[h] = d.Size
		total += d.Size
	}
	return nil
}

// finish checks, at the trailer, that the section holds the whole image
// of the manifest.
func (c *templateCheck) finish() error {
	if c == nil {
		return nil
	}
	if !c.layout || c.index == nil {
		return invalid("its manifest says it carries its template, but the template section is missing or incomplete")
	}
	var idx imageIndex
	if err := json.Unmarshal(c.index, &idx); err != nil || len(idx.Manifests) != 1 {
		return invalid("the template's index.json does not name exactly one image (%v)", err)
	}
	if d := idx.Manifests[0].Digest; d != "sha256:"+c.manifestHex {
		return invalid("the template's index.json names image %s, not the manifest's sha256:%s", d, c.manifestHex)
	}
	if !c.blobs[c.manifestHex] {
		return invalid("the template's image manifest sha256:%s is missing", c.manifestHex)
	}
	for _, h := range slices.Sorted(maps.Keys(c.named)) {
		if !c.blobs[h] {
			return invalid("the template's image names blob \"sha256:%s\", which the template section does not hold", h)
		}
	}
	return nil
}
