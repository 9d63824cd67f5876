package imagestore

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// progressStep is how many compressed bytes may be read between progress reports.
const progressStep = 1 << 20

// Unpack makes every layer of img available as an overlayfs lower directory and
// returns their host paths, lowest first. A layer repeated in the image is listed once,
// at its topmost position (overlayfs refuses a directory twice; the merged tree is the
// same). Layers already unpacked are reused; the others are unpacked from their blobs,
// which must be in the store (ErrNotFound otherwise), and checked against their DiffID
// (ErrDigestMismatch). Entries escaping the layer root, or passing through a symlink,
// are refused with ErrInvalidImage.
//
// OCI whiteouts become overlayfs ones: ".wh.<name>" a 0/0 character device <name>,
// ".wh..wh..opq" the xattr trusted.overlay.opaque=y on its directory (so Unpack needs
// root, as overlayfs does). Ownership, modes, xattrs, symlinks, hard links within the
// layer, fifos and modification times are preserved; device nodes are refused
// (ErrInvalidImage), and so is a layer whose files hold more than the store's limit
// (ErrLayerTooLarge). Holes stay holes: those of the tar's sparse files, and every
// run of zero blocks in a file's content, so a layer takes no more host disk than
// its data.
//
// progress, if not nil, is called with the compressed bytes read so far and the
// compressed size of the layers this call unpacks, at least every MiB and once at the
// end (with delivered == total; total is 0 if nothing needed unpacking).
func (s *Store) Unpack(ctx context.Context, img Image, progress func(delivered, total uint64)) ([]string, error) {
	type job struct {
		diffID, digest string
		size           uint64
	}
	var jobs []job
	var total uint64
	planned := map[string]bool{}
	for _, l := range img.Layers {
		h, err := parseDigest(l.DiffID)
		if err != nil {
			return nil, fmt.Errorf("unpack: layer %s: %w", l.Digest, err)
		}
		if planned[h] || s.layerPresent(h) {
			continue
		}
		planned[h] = true
		bh, err := parseDigest(l.Digest)
		if err != nil {
			return nil, fmt.Errorf("unpack: %w", err)
		}
		fi, err := os.Stat(s.blobPath(bh))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("unpack: layer blob %s: %w", l.Digest, ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("unpack: %w", err)
		}
		jobs = append(jobs, job{h, l.Digest, uint64(fi.Size())})
		total += uint64(fi.Size())
	}

	var delivered atomic.Uint64 // added to by decompressor goroutines
	var reported uint64
	report := func(final bool) {
		if progress == nil {
			return
		}
		d := delivered.Load()
		if final || d-reported >= progressStep {
			reported = d
			progress(d, total)
		}
	}
	for _, j := range jobs {
		var read atomic.Uint64
		count := func(n int) { read.Add(uint64(n)); delivered.Add(uint64(n)) }
		if err := s.unpackLayer(ctx, j.diffID, j.digest, count, func() { report(false) }); err != nil {
			return nil, fmt.Errorf("unpack: layer sha256:%s: %w", j.diffID, err)
		}
		if r := read.Load(); r < j.size { // trailing bytes not read, or unpacked by another caller
			delivered.Add(j.size - r)
		}
	}
	// Mark every layer used, so that RemoveLayers leaves it to the caller to
	// mount; one removed since it was planned is unpacked again.
	for _, l := range img.Layers {
		h, _ := parseDigest(l.DiffID)
		if err := s.unpackLayer(ctx, h, l.Digest, func(int) {}, func() {}); err != nil {
			return nil, fmt.Errorf("unpack: layer %s: %w", l.DiffID, err)
		}
	}
	report(true)

	var dirs []string
	seen := map[string]bool{}
	for i := len(img.Layers) - 1; i >= 0; i-- {
		h, _ := parseDigest(img.Layers[i].DiffID)
		if !seen[h] {
			seen[h] = true
			dirs = append(dirs, s.unpackedPath(h))
		}
	}
	for i, j := 0, len(dirs)-1; i < j; i, j = i+1, j-1 {
		dirs[i], dirs[j] = dirs[j], dirs[i]
	}
	return dirs, nil
}

// UnpackedBytes returns the summed size of the regular files in img's unpacked layers
// (each distinct layer once). It returns ErrNotFound if a layer is not unpacked.
func (s *Store) UnpackedBytes(img Image) (uint64, error) {
	var sum uint64
	seen := map[string]bool{}
	for _, l := range img.Layers {
		h, err := parseDigest(l.DiffID)
		if err != nil {
			return 0, err
		}
		if seen[h] {
			continue
		}
		seen[h] = true
		if !s.layerPresent(h) {
			return 0, fmt.Errorf("layer %s: %w", l.DiffID, ErrNotFound)
		}
		n, err := s.layerSize(h)
		if err != nil {
			return 0, fmt.Errorf("layer %s: %w", l.DiffID, err)
		}
		sum += n
	}
	return sum, nil
}

func (s *Store) unpackedPath(diffHex string) string { return filepath.Join(s.layerDir(), diffHex) }
func (s *Store) sizePath(diffHex string) string     { return s.unpackedPath(diffHex) + ".size" }

func (s *Store) layerPresent(diffHex string) bool {
	fi, err := os.Lstat(s.unpackedPath(diffHex))
	return err == nil && fi.IsDir()
}

// layerSize reads the size recorded at unpack time, or, if a crash lost it, walks
// the layer.
func (s *Store) layerSize(diffHex string) (uint64, error) {
	if b, err := os.ReadFile(s.sizePath(diffHex)); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return n, nil
		}
	}
	var sum uint64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(s.unpackedPath(diffHex), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*unix.Stat_t); ok {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		sum += uint64(fi.Size())
		return nil
	})
	return sum, err
}

func (s *Store) layerLock(diffHex string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.unpacking[diffHex]
	if m == nil {
		m = new(sync.Mutex)
		s.unpacking[diffHex] = m
	}
	return m
}

// unpackLayer unpacks the layer blob (by its digest) into a temporary directory,
// verifies its DiffID, renames it into place, and marks it used; a layer already
// present is only marked. count sees compressed reads; tick runs on the calling
// goroutine as the extraction advances.
func (s *Store) unpackLayer(ctx context.Context, diffHex, digest string, count func(int), tick func()) (err error) {
	lock := s.layerLock(diffHex)
	lock.Lock()
	defer lock.Unlock()
	if s.layerPresent(diffHex) {
		return s.markUsed(diffHex, digest)
	}
	bh, err := parseDigest(digest)
	if err != nil {
		return err
	}
	blob := s.blobPath(bh)
	if _, err := os.Stat(blob); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("layer blob %s: %w", digest, ErrNotFound)
	}
	tmp, err := os.MkdirTemp(s.tmpDir(), "unpack-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}

	rc, err := openLayer(blob, count)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidImage, err)
	}
	defer rc.Close()
	d := sha256.New()
	in := io.TeeReader(tickReader{ctxReader{ctx, rc}, tick}, d)
	size, err := extractLayer(tar.NewReader(in), tmp, s.maxLayerBytes.Load())
	if err == nil {
		_, err = io.Copy(io.Discard, in) // the tar's padding, for the DiffID
		if err != nil {
			err = fmt.Errorf("%w: %v", ErrInvalidImage, err)
		}
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return err
	}
	if got := hexSum(d); got != diffHex {
		return fmt.Errorf("%w: uncompressed content is sha256:%s", ErrDigestMismatch, got)
	}

	if err := syncFS(tmp); err != nil {
		return err
	}
	if err := writeFileAtomic(s.sizePath(diffHex), []byte(strconv.FormatUint(size, 10)+"\n"), s.tmpDir()); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.unpackedPath(diffHex)); err != nil && !s.layerPresent(diffHex) { // else another process won the race
		return err
	}
	return s.markUsed(diffHex, digest)
}

type tickReader struct {
	r    io.Reader
	tick func()
}

func (t tickReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.tick()
	return n, err
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

func writeFileAtomic(path string, data []byte, tmpDir string) error {
	f, err := os.CreateTemp(tmpDir, "file-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
