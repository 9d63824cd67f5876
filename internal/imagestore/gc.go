package imagestore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Garbage collection. Two owners share a Store's bytes: the control plane owns
// the blobs (it imports them and serves them to hosts), a host owns the
// unpacked layers (it unpacks them and mounts them). Each collects its own:
//
//   - RemoveBlobs, by the control plane: blobs of no live template revision.
//   - RemoveLayers, by a host: unpacked layers no execution uses and whose
//     blob is gone (so no live revision needs them either).
//
// Both spare anything touched since a cutoff: an import commits its blobs
// with a fresh modification time before its revision is recorded, and Unpack
// marks each layer it returns as used (its ".blob" file) before the caller
// mounts it, so neither is collected in between.

// RemoveBlobs deletes the blobs whose digest is not in keep and that were
// last committed before cutoff, and stale staging files (see removeStaleTemp).
// It returns the digests it deleted.
func (s *Store) RemoveBlobs(keep map[string]bool, cutoff time.Time) ([]string, error) {
	ents, err := os.ReadDir(s.blobDir())
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		digest := "sha256:" + e.Name()
		if keep[digest] || !olderThan(e, cutoff) {
			continue
		}
		if err := os.Remove(s.blobPath(e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, err
		}
		removed = append(removed, digest)
	}
	return removed, s.removeStaleTemp(cutoff)
}

// RemoveLayers deletes the unpacked layers whose DiffID is not in keep, whose
// blob the store no longer holds, and that Unpack last returned before cutoff,
// and stale staging files. It returns the DiffIDs it deleted. A layer goes
// away atomically: it is renamed into tmp/ before its files are removed.
func (s *Store) RemoveLayers(keep map[string]bool, cutoff time.Time) ([]string, error) {
	ents, err := os.ReadDir(s.layerDir())
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		h := e.Name()
		if !e.IsDir() || parseHex(h) != nil || keep["sha256:"+h] {
			continue
		}
		ok, err := s.removeLayer(h, cutoff)
		if err != nil {
			return removed, err
		}
		if ok {
			removed = append(removed, "sha256:"+h)
		}
	}
	// Marker files of layers a crash left without their directory.
	for _, e := range ents {
		h, ok := strings.CutSuffix(e.Name(), ".size")
		if !ok {
			h, ok = strings.CutSuffix(e.Name(), ".blob")
		}
		if ok && !s.layerPresent(h) && olderThan(e, cutoff) {
			if err := os.Remove(filepath.Join(s.layerDir(), e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return removed, err
			}
		}
	}
	return removed, s.removeStaleTemp(cutoff)
}

// removeLayer deletes one unpacked layer if its blob is gone and it has not
// been used since cutoff, under the layer's lock so that Unpack cannot hand
// it out meanwhile.
func (s *Store) removeLayer(diffHex string, cutoff time.Time) (bool, error) {
	lock := s.layerLock(diffHex)
	lock.Lock()
	defer lock.Unlock()
	if !s.layerPresent(diffHex) {
		return false, nil
	}
	if blob, err := os.ReadFile(s.blobRefPath(diffHex)); err == nil && s.HasBlob(strings.TrimSpace(string(blob))) {
		return false, nil
	}
	if used, err := s.lastUse(diffHex); err != nil || used.After(cutoff) {
		return false, err
	}
	doomed, err := os.MkdirTemp(s.tmpDir(), "remove-*")
	if err != nil {
		return false, err
	}
	if err := os.Rename(s.unpackedPath(diffHex), filepath.Join(doomed, "layer")); err != nil {
		os.Remove(doomed)
		return false, err
	}
	for _, p := range []string{s.sizePath(diffHex), s.blobRefPath(diffHex)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return true, err
		}
	}
	return true, os.RemoveAll(doomed)
}

// lastUse is when Unpack last returned the layer: its ".blob" file's time, or
// for a layer unpacked before such marks, its directory's.
func (s *Store) lastUse(diffHex string) (time.Time, error) {
	fi, err := os.Stat(s.blobRefPath(diffHex))
	if errors.Is(err, fs.ErrNotExist) {
		fi, err = os.Stat(s.unpackedPath(diffHex))
	}
	if err != nil {
		return time.Time{}, err
	}
	return fi.ModTime(), nil
}

// markUsed records that Unpack hands out the layer now, unpacked from blob.
// The caller holds the layer's lock. A mark that names blob already only
// has its time set, unsynced: every start passes here, and the time need
// not outlive a crash (a layer an execution uses is kept whatever its time;
// one no execution uses may go).
func (s *Store) markUsed(diffHex, blob string) error {
	path := s.blobRefPath(diffHex)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == blob {
		now := time.Now()
		return os.Chtimes(path, now, now)
	}
	return writeFileAtomic(path, []byte(blob+"\n"), s.tmpDir())
}

// blobRefPath names the blob a layer was unpacked from; its time is the
// layer's last use.
func (s *Store) blobRefPath(diffHex string) string { return s.unpackedPath(diffHex) + ".blob" }

// removeStaleTemp deletes what imports, unpacks and removals left in tmp/
// (after a crash) when nothing in it has changed since cutoff.
func (s *Store) removeStaleTemp(cutoff time.Time) error {
	ents, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(s.tmpDir(), e.Name())
		if newestChange(p).After(cutoff) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}

// newestChange is the latest modification of anything under p. An entry
// dated in the future (an unpacked file's modification time is its
// image's to set) counts by its change time, which no image sets: when it
// was written. An entry that vanishes while it is read counts as changing
// now.
func newestChange(p string) time.Time {
	var newest time.Time
	now := time.Now()
	err := filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		t := fi.ModTime()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && t.After(now) {
			t = time.Unix(st.Ctim.Unix())
		}
		if t.After(newest) {
			newest = t
		}
		return nil
	})
	if err != nil {
		return time.Now()
	}
	return newest
}

func olderThan(e fs.DirEntry, cutoff time.Time) bool {
	fi, err := e.Info()
	return err == nil && fi.ModTime().Before(cutoff)
}

// parseHex checks a store file name as the hex of a sha256 digest.
func parseHex(h string) error {
	_, err := parseDigest("sha256:" + h)
	if err != nil {
		return fmt.Errorf("%q: %w", h, err)
	}
	return nil
}
