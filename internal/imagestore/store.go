// Package imagestore keeps workspace template images on disk, content-addressed.
//
// A template is an OCI image (from an image archive, an OCI layout or, through the
// caller, a registry). go-containerregistry reads the image; a Store keeps its parts
// under one directory:
//
//	blobs/sha256/<hex>               compressed layers, image configs, manifests
//	layers/sha256/<diffid hex>/      a layer unpacked as an overlayfs lower directory
//	layers/sha256/<diffid hex>.size  its unpacked size in bytes (for reporting)
//	layers/sha256/<diffid hex>.blob  the blob it was unpacked from; its time is the
//	                                 layer's last use (see gc.go)
//	tmp/                             staging for imports, blob writes, unpacks and removals
//
// Every blob is verified against its digest before it becomes visible, and appears by
// rename, so a reader never sees a partial blob. An import stages all its blobs and
// commits them only once every one has been verified, the manifest last: a manifest in
// blobs/ implies its config and layers are there too. A layer is unpacked into tmp/
// and renamed into layers/, so a crash never leaves a half layer visible. Leftovers in
// tmp/ after a crash are removed by RemoveBlobs and RemoveLayers once stale.
//
// Nothing in this package reaches the network: a registry import is
// ImportImage(ctx, remote.Image(ref)) by the caller.
package imagestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
)

// Errors returned by Store methods, matched with errors.Is.
var (
	// ErrNotFound: the blob, image or unpacked layer is not in the store.
	ErrNotFound = errors.New("not found")
	// ErrDigestMismatch: content does not match the digest (or size) it was given under.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrInvalidDigest: a digest is not of the form sha256:<64 lowercase hex>.
	ErrInvalidDigest = errors.New("invalid digest")
	// ErrInvalidImage: the archive, layout, manifest or layer is malformed or unsafe
	// (several images where one is required, a tar entry escaping its root, ...).
	ErrInvalidImage = errors.New("invalid image")
	// ErrUnsupportedPlatform: the image is not linux/amd64.
	ErrUnsupportedPlatform = errors.New("unsupported platform")
	// ErrLayerTooLarge: a layer's files hold more bytes than the store's limit
	// (SetMaxLayerBytes); always wrapped with ErrInvalidImage.
	ErrLayerTooLarge = errors.New("layer too large")
)

// DefaultMaxLayerBytes is the default bound on the bytes of file content one
// layer may unpack to (see SetMaxLayerBytes).
const DefaultMaxLayerBytes uint64 = 16 << 30

// Store is a directory of content-addressed template images. It is safe for
// concurrent use, also by several processes sharing the directory.
type Store struct {
	dir string

	mu        sync.Mutex
	unpacking map[string]*sync.Mutex // diffID hex -> lock, so one process unpacks a layer once

	maxLayerBytes atomic.Uint64
}

// SetMaxLayerBytes bounds the bytes of file content (sparse files at their
// full size) one layer may hold: an import or unpack of a larger layer fails
// with ErrLayerTooLarge. Zero restores DefaultMaxLayerBytes.
func (s *Store) SetMaxLayerBytes(n uint64) {
	if n == 0 {
		n = DefaultMaxLayerBytes
	}
	s.maxLayerBytes.Store(n)
}

// Open returns the Store rooted at dir, creating its directories if needed.
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	s := &Store{dir: abs, unpacking: make(map[string]*sync.Mutex)}
	s.SetMaxLayerBytes(0)
	for _, d := range []string{s.blobDir(), s.layerDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("template store: %w", err)
		}
	}
	return s, nil
}

// Dir returns the store's root directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) blobDir() string  { return filepath.Join(s.dir, "blobs", "sha256") }
func (s *Store) layerDir() string { return filepath.Join(s.dir, "layers", "sha256") }
func (s *Store) tmpDir() string   { return filepath.Join(s.dir, "tmp") }

func (s *Store) blobPath(hexDigest string) string { return filepath.Join(s.blobDir(), hexDigest) }

// parseDigest returns the hex part of "sha256:<64 lowercase hex>".
func parseDigest(d string) (string, error) {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", fmt.Errorf("%w: %q", ErrInvalidDigest, d)
	}
	return h, nil
}

// HasBlob reports whether the blob with this digest is in the store.
func (s *Store) HasBlob(digest string) bool {
	h, err := parseDigest(digest)
	if err != nil {
		return false
	}
	fi, err := os.Stat(s.blobPath(h))
	return err == nil && fi.Mode().IsRegular()
}

// Blob opens the blob with this digest and returns it with its size.
// It returns ErrNotFound if the store does not hold it.
func (s *Store) Blob(digest string) (io.ReadCloser, int64, error) {
	h, err := parseDigest(digest)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.Open(s.blobPath(h))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("blob %s: %w", digest, ErrNotFound)
	}
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// PutBlob stores r's content under digest, as when a host fetches a template's
// blobs from ctrl. It returns ErrDigestMismatch, storing nothing, if the content
// does not hash to digest. If the blob is already present r is not read.
func (s *Store) PutBlob(digest string, r io.Reader) error {
	h, err := parseDigest(digest)
	if err != nil {
		return err
	}
	if s.HasBlob(digest) {
		return nil
	}
	tmp, err := writeVerified(context.Background(), s.tmpDir(), digest, -1, r)
	if err != nil {
		return fmt.Errorf("put blob %s: %w", digest, err)
	}
	defer os.Remove(tmp)
	if err := os.Rename(tmp, s.blobPath(h)); err != nil {
		return fmt.Errorf("put blob %s: %w", digest, err)
	}
	return nil
}

// writeVerified copies r into a new file in dir, checks it against digest (and size
// unless negative), syncs it and returns its path. On error no file is left.
func writeVerified(ctx context.Context, dir, digest string, size int64, r io.Reader) (path string, err error) {
	want, err := parseDigest(digest)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, "blob-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	d := sha256.New()
	if size >= 0 {
		r = io.LimitReader(r, size+1) // enough to tell it is too long
	}
	n, err := io.Copy(io.MultiWriter(f, d), ctxReader{ctx, r})
	if err != nil {
		return "", err
	}
	if size >= 0 && n != size {
		return "", fmt.Errorf("%w: the content is not %d bytes long", ErrDigestMismatch, size)
	}
	if got := hexSum(d); got != want {
		return "", fmt.Errorf("%w: content is sha256:%s", ErrDigestMismatch, got)
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return f.Name(), nil
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// ctxReader fails reads once ctx is done, so long copies stop on cancellation.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
