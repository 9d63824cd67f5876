package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// Image is a template image held in a Store.
type Image struct {
	ManifestDigest string // sha256:<hex> of the raw manifest
	ConfigDigest   string // sha256:<hex> of the image config blob
	Config         ImageConfig
	Layers         []Layer // lowest first
}

// Layer is one filesystem layer of an Image.
type Layer struct {
	Digest string // sha256:<hex> of the compressed blob
	DiffID string // sha256:<hex> of the uncompressed tar
	Size   int64  // compressed size in bytes
}

// ImageConfig is the part of an image config that starts its processes.
type ImageConfig struct {
	Env        []string
	Entrypoint []string
	Cmd        []string
	WorkingDir string
	User       string
	// Display is the screen the image's workspaces carry, from its label
	// guestabi.DisplayLabel; nil without the label.
	Display *guestabi.DisplaySize
}

// Blobs returns the digests of every blob the image consists of (manifest, config,
// then layers, without repeats): what a host must hold to use it.
func (img Image) Blobs() []string {
	out := []string{img.ManifestDigest, img.ConfigDigest}
	seen := map[string]bool{img.ManifestDigest: true, img.ConfigDigest: true}
	for _, l := range img.Layers {
		if !seen[l.Digest] {
			seen[l.Digest] = true
			out = append(out, l.Digest)
		}
	}
	return out
}

// Revision returns the immutable template revision derived from a manifest digest:
// "sha256-" and the first 16 hex characters. It returns "" for an invalid digest.
func Revision(manifestDigest string) string {
	h, err := parseDigest(manifestDigest)
	if err != nil {
		return ""
	}
	return "sha256-" + h[:16]
}

// ImportImage stores img's layers, config and manifest and returns the stored Image.
// Every blob is read from img in full and verified (layers also against their DiffID)
// before any is committed, also when the store already holds it: the store is shared,
// so naming a digest must never be enough to gain its content. img must be a single
// linux/amd64 image
// (ErrUnsupportedPlatform otherwise) with Docker v2 schema 2 or OCI media types
// (ErrInvalidImage otherwise).
func (s *Store) ImportImage(ctx context.Context, img v1.Image) (Image, error) {
	out, err := s.importImage(ctx, img)
	if err != nil {
		return Image{}, fmt.Errorf("import image: %w", err)
	}
	return out, nil
}

func (s *Store) importImage(ctx context.Context, img v1.Image) (Image, error) {
	rawManifest, err := img.RawManifest()
	if err != nil {
		return Image{}, fmt.Errorf("reading manifest: %w", err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(rawManifest))
	if err != nil {
		return Image{}, fmt.Errorf("%w: parsing manifest: %v", ErrInvalidImage, err)
	}
	if mt := manifestMediaType(m, rawManifest); !mt.IsImage() {
		return Image{}, fmt.Errorf("%w: manifest media type %q is not an image manifest", ErrInvalidImage, mt)
	}
	// A registry sends what the manifest declares, at most; a size it
	// does not declare (-1) would be read to the end.
	if m.Config.Size < 0 || m.Config.Size > maxConfigBytes {
		return Image{}, fmt.Errorf("%w: its config is %d bytes; at most %d are taken", ErrInvalidImage, m.Config.Size, maxConfigBytes)
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return Image{}, fmt.Errorf("reading config: %w", err)
	}
	if d := sha256Digest(rawConfig); d != m.Config.Digest.String() {
		return Image{}, fmt.Errorf("%w: config is %s, manifest names %s", ErrInvalidImage, d, m.Config.Digest)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawConfig))
	if err != nil {
		return Image{}, fmt.Errorf("%w: parsing config: %v", ErrInvalidImage, err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		return Image{}, fmt.Errorf("%w: image is %s, want linux/amd64", ErrUnsupportedPlatform, platformString(cf.OS, cf.Architecture, cf.Variant))
	}
	if len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return Image{}, fmt.Errorf("%w: manifest has %d layers, config %d diff_ids", ErrInvalidImage, len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	if _, err := displayOf(cf.Config.Labels); err != nil {
		return Image{}, err
	}
	if err := checkRunnable(len(rawConfig), len(m.Layers), cf.Config.Env); err != nil {
		return Image{}, err
	}

	stage, err := os.MkdirTemp(s.tmpDir(), "import-*")
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(stage)

	type staged struct{ path, hex string }
	var commits []staged
	diffIDs := map[string]string{} // layer blob hex -> its DiffID
	for i, desc := range m.Layers {
		if err := ctx.Err(); err != nil {
			return Image{}, err
		}
		digest, diffID := desc.Digest.String(), cf.RootFS.DiffIDs[i].String()
		if !desc.MediaType.IsLayer() {
			return Image{}, fmt.Errorf("%w: layer %s has media type %q", ErrInvalidImage, digest, desc.MediaType)
		}
		if desc.Size < 0 {
			return Image{}, fmt.Errorf("%w: layer %s has size %d", ErrInvalidImage, digest, desc.Size)
		}
		h, err := parseDigest(digest)
		if err != nil {
			return Image{}, fmt.Errorf("%w: layer %d: %v", ErrInvalidImage, i, err)
		}
		if prev, ok := diffIDs[h]; ok {
			if prev != diffID { // one blob cannot have two DiffIDs
				return Image{}, fmt.Errorf("%w: layer %s is listed with DiffIDs %s and %s", ErrInvalidImage, digest, prev, diffID)
			}
			continue
		}
		diffIDs[h] = diffID
		p, err := s.stageLayer(ctx, stage, img, desc, diffID)
		if err != nil {
			return Image{}, fmt.Errorf("layer %s: %w", digest, err)
		}
		commits = append(commits, staged{p, h})
	}
	manifestDigest := sha256Digest(rawManifest)
	for _, b := range []struct {
		digest string
		data   []byte
	}{{m.Config.Digest.String(), rawConfig}, {manifestDigest, rawManifest}} {
		h, err := parseDigest(b.digest)
		if err != nil {
			return Image{}, fmt.Errorf("%w: %v", ErrInvalidImage, err)
		}
		p, err := writeVerified(ctx, stage, b.digest, -1, bytes.NewReader(b.data))
		if err != nil {
			return Image{}, err
		}
		commits = append(commits, staged{p, h})
	}

	// Commit: layers, then config, then manifest, each by an atomic rename. A
	// blob committed again gets a new modification time, which keeps it from
	// garbage collection while the caller records the image (see RemoveBlobs).
	now := time.Now()
	for _, c := range commits {
		if err := os.Chtimes(c.path, now, now); err != nil {
			return Image{}, err
		}
		if err := os.Rename(c.path, s.blobPath(c.hex)); err != nil {
			return Image{}, err
		}
	}
	return s.Image(manifestDigest)
}

// stageLayer writes desc's compressed blob into dir, verifying its digest, size,
// DiffID and entries (see checkLayer), and returns the file's path.
func (s *Store) stageLayer(ctx context.Context, dir string, img v1.Image, desc v1.Descriptor, diffID string) (string, error) {
	l, err := img.LayerByDigest(desc.Digest)
	if err != nil {
		return "", err
	}
	rc, err := l.Compressed()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	p, err := writeVerified(ctx, dir, desc.Digest.String(), desc.Size, rc)
	if err != nil {
		return "", err
	}
	if err := checkLayer(ctx, p, diffID, s.maxLayerBytes.Load()); err != nil {
		os.Remove(p)
		return "", err
	}
	return p, nil
}

// checkLayer decompresses the layer blob at path, checks the tar's digest, and
// reads its entries as Unpack will admit them (layerBudget), so that a layer no
// host would unpack is refused at import.
func checkLayer(ctx context.Context, path, diffID string, limit uint64) error {
	rc, err := openLayer(path, nil)
	if err != nil {
		return err
	}
	defer rc.Close()
	d := sha256.New()
	in := io.TeeReader(ctxReader{ctx, rc}, d)
	err = scanLayer(tar.NewReader(in), limit)
	if err == nil {
		_, err = io.Copy(io.Discard, in) // the tar's padding, for the DiffID
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if errors.Is(err, ErrInvalidImage) {
			return err
		}
		return fmt.Errorf("%w: decompressing: %v", ErrInvalidImage, err)
	}
	if got := "sha256:" + hexSum(d); got != diffID {
		return fmt.Errorf("%w: uncompressed content is %s, config names %s", ErrDigestMismatch, got, diffID)
	}
	return nil
}

// Image reads the image with this manifest digest back from the store. It returns
// ErrNotFound if the manifest or its config is missing; the layer blobs need not be
// present (a host fetches them before Unpack).
func (s *Store) Image(manifestDigest string) (Image, error) {
	rawManifest, err := s.readBlob(manifestDigest)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", manifestDigest, err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(rawManifest))
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w: %v", manifestDigest, ErrInvalidImage, err)
	}
	rawConfig, err := s.readBlob(m.Config.Digest.String())
	if err != nil {
		return Image{}, fmt.Errorf("image %s: config: %w", manifestDigest, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawConfig))
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w: config: %v", manifestDigest, ErrInvalidImage, err)
	}
	if len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return Image{}, fmt.Errorf("image %s: %w: %d layers, %d diff_ids", manifestDigest, ErrInvalidImage, len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	display, err := displayOf(cf.Config.Labels)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", manifestDigest, err)
	}
	img := Image{
		ManifestDigest: manifestDigest,
		ConfigDigest:   m.Config.Digest.String(),
		Config: ImageConfig{
			Env:        cf.Config.Env,
			Entrypoint: cf.Config.Entrypoint,
			Cmd:        cf.Config.Cmd,
			WorkingDir: cf.Config.WorkingDir,
			User:       cf.Config.User,
			Display:    display,
		},
	}
	for i, desc := range m.Layers {
		img.Layers = append(img.Layers, Layer{
			Digest: desc.Digest.String(),
			DiffID: cf.RootFS.DiffIDs[i].String(),
			Size:   desc.Size,
		})
	}
	return img, nil
}

// The bounds of what a workspace can run: an image beyond them is refused
// at import rather than failing every start.
const (
	// MaxLayers is how many layers a workspace's root may stack (the
	// overlay's options, a layer named in about 17 bytes, fit in a page).
	MaxLayers = 200
	// MaxEnvBytes bounds an image's environment, which every process of
	// its workspaces receives and every workspace's record carries.
	MaxEnvBytes = 128 << 10
	// maxConfigBytes bounds the config file ctrl parses, and every other
	// document of an image read whole (an archive's manifest.json, a
	// layout's index.json, indexes and manifests): checked before the
	// read, so that a declared or archived giant never enters memory.
	maxConfigBytes = 4 << 20
)

// checkRunnable refuses (ErrInvalidImage) an image that no workspace could
// run: no layer or more than MaxLayers, a config over maxConfigBytes, an
// environment over MaxEnvBytes or with an entry that is not NAME=VALUE
// (a name, no NUL byte).
func checkRunnable(configBytes, layers int, env []string) error {
	switch {
	case configBytes > maxConfigBytes:
		return fmt.Errorf("%w: its config is %d bytes; at most %d are taken", ErrInvalidImage, configBytes, maxConfigBytes)
	case layers == 0:
		return fmt.Errorf("%w: it has no layer; a workspace's root needs at least one", ErrInvalidImage)
	case layers > MaxLayers:
		return fmt.Errorf("%w: it has %d layers; a workspace's root stacks at most %d", ErrInvalidImage, layers, MaxLayers)
	}
	total := 0
	for i, kv := range env {
		total += len(kv) + 1
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || strings.ContainsRune(kv, 0) {
			return fmt.Errorf("%w: config Env[%d] %.40q is not NAME=VALUE without NUL bytes", ErrInvalidImage, i, kv)
		}
	}
	if total > MaxEnvBytes {
		return fmt.Errorf("%w: its config's Env is %d bytes; at most %d are taken", ErrInvalidImage, total, MaxEnvBytes)
	}
	return nil
}

// displayOf reads the display label of an image config's labels: nil
// without one, ErrInvalidImage when it is not a display size.
func displayOf(labels map[string]string) (*guestabi.DisplaySize, error) {
	v, ok := labels[guestabi.DisplayLabel]
	if !ok {
		return nil, nil
	}
	d, err := guestabi.ParseDisplaySize(v)
	if err != nil {
		return nil, fmt.Errorf("%w: label %s: %v", ErrInvalidImage, guestabi.DisplayLabel, err)
	}
	return &d, nil
}

// readBlob returns a small blob's content (a manifest or config).
func (s *Store) readBlob(digest string) ([]byte, error) {
	rc, _, err := s.Blob(digest)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// manifestMediaType is the manifest's mediaType field, or for an OCI manifest that
// omits it, the OCI type.
func manifestMediaType(m *v1.Manifest, raw []byte) types.MediaType {
	if m.MediaType != "" {
		return m.MediaType
	}
	var probe struct {
		SchemaVersion int             `json:"schemaVersion"`
		Config        json.RawMessage `json:"config"`
	}
	if json.Unmarshal(raw, &probe) == nil && probe.SchemaVersion == 2 && probe.Config != nil {
		return types.OCIManifestSchema1
	}
	return ""
}

func sha256Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return fmt.Sprintf("sha256:%x", sum)
}

func platformString(os, arch, variant string) string {
	p := v1.Platform{OS: os, Architecture: arch, Variant: variant}
	if s := p.String(); s != "" && os != "" && arch != "" {
		return s
	}
	return fmt.Sprintf("%q/%q", os, arch)
}

// blobLayer is a compressed layer blob on disk, read through go-containerregistry so
// that gzip, zstd and uncompressed layers all decompress the same way. count, if not
// nil, is told the size of every compressed read.
type blobLayer struct {
	path  string
	count func(n int)
}

func (b blobLayer) Compressed() (io.ReadCloser, error) {
	f, err := os.Open(b.path)
	if err != nil {
		return nil, err
	}
	if b.count == nil {
		return f, nil
	}
	return countingReadCloser{f, b.count}, nil
}

// Only Compressed is used (by Uncompressed); the blob was verified when stored.
func (b blobLayer) Digest() (v1.Hash, error)            { return v1.Hash{}, errors.New("not used") }
func (b blobLayer) Size() (int64, error)                { return 0, errors.New("not used") }
func (b blobLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }

var _ partial.CompressedLayer = blobLayer{}

// openLayer returns the uncompressed tar of the layer blob at path.
func openLayer(path string, count func(int)) (io.ReadCloser, error) {
	l, err := partial.CompressedToLayer(blobLayer{path: path, count: count})
	if err != nil {
		return nil, err
	}
	return l.Uncompressed()
}

type countingReadCloser struct {
	io.ReadCloser
	count func(n int)
}

func (c countingReadCloser) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if n > 0 {
		c.count(n)
	}
	return n, err
}
