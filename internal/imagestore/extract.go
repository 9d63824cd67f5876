package imagestore

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/sparsefile"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
)

// extractor writes one layer's tar into root as an overlayfs lower directory.
type extractor struct {
	root     string
	dirs     map[string]bool // relative paths known to be real directories
	dirTimes []entryTimes    // applied last, since creating children changes them
	budget   layerBudget
}

// layerBudget admits a layer's tar entries one by one: no device nodes (they
// would be created on the host with the image's modes), owners that are
// user and group IDs, and at most limit bytes in all: the content of
// regular files (holes of sparse files included), and a block for every
// other entry (a directory, a symlink, a hard link), which takes one on
// the host's disk however small its archive.
type layerBudget struct {
	limit uint64
	size  uint64 // bytes admitted so far
}

const (
	// entryBytes is what an entry other than a regular file counts.
	entryBytes = 4096
	// maxOwnerID is the largest user or group ID (the next, -1, means
	// "unchanged" to chown).
	maxOwnerID = 1<<32 - 2
)

func (b *layerBudget) admit(hdr *tar.Header) error {
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > maxOwnerID || hdr.Gid > maxOwnerID {
		return fmt.Errorf("%w: %q belongs to %d:%d, which are not a user and group ID", ErrInvalidImage, hdr.Name, hdr.Uid, hdr.Gid)
	}
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("%w: %q is a device node; layers may not hold device nodes", ErrInvalidImage, hdr.Name)
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeCont:
		b.size += uint64(max(hdr.Size, 0))
	default:
		b.size += entryBytes
	}
	if b.size > b.limit {
		return fmt.Errorf("%w: %w: its entries take more than %d bytes (a file its size, any other entry %d)", ErrInvalidImage, ErrLayerTooLarge, b.limit, entryBytes)
	}
	return nil
}

type entryTimes struct {
	rel, path    string
	atime, mtime time.Time
}

// scanLayer reads a layer's tar to its end, admitting each entry as
// extractLayer does, without writing anything: its budget, and where each
// entry would land (layerShape), so that an import refuses a layer no
// host could unpack.
func scanLayer(tr *tar.Reader, limit uint64) error {
	b := layerBudget{limit: limit}
	shape := layerShape{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: reading layer tar: %v", ErrInvalidImage, err)
		}
		if err := b.admit(hdr); err != nil {
			return err
		}
		if err := shape.admit(hdr); err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
	}
}

// layerShape is what the entries of a layer read so far leave at each
// path, as far as extractLayer's refusals go: a path whose last entry is
// a symlink or another non-directory can be no entry's parent, and a hard
// link needs an earlier non-directory entry.
type layerShape map[string]byte // path → tar type flag of its last entry, or whiteoutShape

// whiteoutShape marks a path a whiteout of the layer hides in the lower
// ones, where the layer has no entry of its own (yet).
const whiteoutShape = 'w'

func (l layerShape) admit(hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := entryPath(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: the layer root must be a directory", ErrInvalidImage)
		}
		return nil
	}
	if err := l.parents(rel); err != nil {
		return err
	}
	if base := path.Base(rel); strings.HasPrefix(base, whiteoutPrefix) {
		if name := strings.TrimPrefix(base, whiteoutPrefix); base != whiteoutOpaque {
			if name == "" || name == "." || name == ".." {
				return fmt.Errorf("%w: malformed whiteout", ErrInvalidImage)
			}
			// A whiteout hides the lower layers' entry; one of this layer
			// stays (extractor.whiteout).
			if target := path.Join(path.Dir(rel), name); l[target] == 0 {
				l[target] = whiteoutShape
			}
		}
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeGNUSparse, tar.TypeCont, tar.TypeSymlink, tar.TypeFifo:
	case tar.TypeLink:
		target, err := entryPath(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("link target: %w", err)
		}
		if kind, ok := l[target]; !ok || kind == tar.TypeDir || kind == whiteoutShape || target == rel {
			return fmt.Errorf("%w: hard link to %q, which is not an earlier non-directory entry", ErrInvalidImage, hdr.Linkname)
		}
	default:
		return fmt.Errorf("%w: unsupported entry type %q", ErrInvalidImage, hdr.Typeflag)
	}
	if kind, ok := l[rel]; ok && kind == tar.TypeDir && hdr.Typeflag != tar.TypeDir {
		l.removeTree(rel) // a directory replaced, with what was in it
	}
	l[rel] = hdr.Typeflag
	return nil
}

// parents refuses rel when an ancestor is a symlink or not a directory.
func (l layerShape) parents(rel string) error {
	for p := path.Dir(rel); p != "."; p = path.Dir(p) {
		switch kind, ok := l[p]; {
		case kind == whiteoutShape:
			l[p] = tar.TypeDir // a new directory in place of the lower one
		case !ok || kind == tar.TypeDir:
		case kind == tar.TypeSymlink:
			return fmt.Errorf("%w: parent %q is a symlink", ErrInvalidImage, p)
		default:
			return fmt.Errorf("%w: parent %q is not a directory", ErrInvalidImage, p)
		}
	}
	return nil
}

// removeTree forgets rel and everything under it.
func (l layerShape) removeTree(rel string) {
	delete(l, rel)
	for p := range l {
		if strings.HasPrefix(p, rel+"/") {
			delete(l, p)
		}
	}
}

// extractLayer extracts tr into root (an existing empty directory) and returns the
// bytes of regular file content written. The layer may hold at most limit such
// bytes (ErrLayerTooLarge) and no device node (ErrInvalidImage).
func extractLayer(tr *tar.Reader, root string, limit uint64) (uint64, error) {
	x := &extractor{root: root, dirs: map[string]bool{".": true}, budget: layerBudget{limit: limit}}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("%w: reading layer tar: %v", ErrInvalidImage, err)
		}
		if err := x.budget.admit(hdr); err != nil {
			return 0, err
		}
		if err := x.entry(hdr, tr); err != nil {
			return 0, fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
	}
	for i := len(x.dirTimes) - 1; i >= 0; i-- {
		t := x.dirTimes[i]
		// Only directories that are still there as directories: a later
		// entry may have replaced one (or a parent) with a symlink, which
		// setting times by path would follow out of the layer.
		if !x.dirs[t.rel] {
			continue
		}
		if err := setTimes(t.path, t.atime, t.mtime); err != nil {
			return 0, err
		}
	}
	return x.budget.size, nil
}

func (x *extractor) abs(rel string) string { return filepath.Join(x.root, filepath.FromSlash(rel)) }

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := entryPath(hdr.Name)
	if err != nil {
		return err
	}
	if base := path.Base(rel); strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(rel, base)
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: the layer root must be a directory", ErrInvalidImage)
		}
		return x.dir(rel, hdr)
	}
	if err := x.parents(rel, true); err != nil {
		return err
	}
	p := x.abs(rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(rel, hdr)
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeCont:
		if err := x.remove(rel); err != nil {
			return err
		}
		if err := sparsefile.Create(p, r); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := x.remove(rel); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
	case tar.TypeLink:
		target, err := entryPath(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("link target: %w", err)
		}
		if err := x.parents(target, false); err != nil {
			return err
		}
		fi, err := os.Lstat(x.abs(target))
		if err != nil || fi.IsDir() || isWhiteout(fi) || target == rel {
			return fmt.Errorf("%w: hard link to %q, which is not an earlier non-directory entry", ErrInvalidImage, hdr.Linkname)
		}
		if err := x.remove(rel); err != nil {
			return err
		}
		return os.Link(x.abs(target), p) // a second name: the target's metadata stands
	case tar.TypeFifo:
		if err := x.remove(rel); err != nil {
			return err
		}
		if err := unix.Mkfifo(p, 0o600); err != nil {
			return &os.PathError{Op: "mkfifo", Path: p, Err: err}
		}
	default:
		return fmt.Errorf("%w: unsupported entry type %q", ErrInvalidImage, hdr.Typeflag)
	}
	if err := applyMeta(p, hdr); err != nil {
		return err
	}
	return setTimes(p, accessTime(hdr), hdr.ModTime)
}

// whiteout converts an OCI whiteout entry to its overlayfs form.
func (x *extractor) whiteout(rel, base string) error {
	if err := x.parents(rel, true); err != nil {
		return err
	}
	dir := path.Dir(rel)
	if base == whiteoutOpaque {
		return setOpaque(x.abs(dir))
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%w: malformed whiteout", ErrInvalidImage)
	}
	target := path.Join(dir, name)
	p := x.abs(target)
	// A whiteout hides the lower layers' entry, never one of its own layer
	// (which hides that already), in whatever order the two come: a
	// directory of this layer then shows nothing of the lower one.
	switch fi, err := os.Lstat(p); {
	case err == nil && fi.IsDir():
		return setOpaque(p)
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
		return &os.PathError{Op: "mknod whiteout", Path: p, Err: err}
	}
	return nil
}

// setOpaque marks the directory at p as hiding the lower layers' one.
func setOpaque(p string) error {
	if err := unix.Lsetxattr(p, opaqueXattr, []byte("y"), 0); err != nil {
		return &os.PathError{Op: "setxattr " + opaqueXattr, Path: p, Err: err}
	}
	return nil
}

// isWhiteout reports whether fi is an overlayfs whiteout (a 0/0 char
// device).
func isWhiteout(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0
}

// dir creates (or keeps) the directory rel and applies hdr's metadata; its times are
// set at the end of the layer.
func (x *extractor) dir(rel string, hdr *tar.Header) error {
	p := x.abs(rel)
	fi, err := os.Lstat(p)
	if err != nil || !fi.IsDir() {
		if err := x.remove(rel); err != nil {
			return err
		}
		if err := mkdir(p, 0o700, err == nil && isWhiteout(fi)); err != nil {
			return err
		}
	}
	x.dirs[rel] = true
	if err := applyMeta(p, hdr); err != nil {
		return err
	}
	x.dirTimes = append(x.dirTimes, entryTimes{rel, p, accessTime(hdr), hdr.ModTime})
	return nil
}

// mkdir creates the directory p with mode, despite the umask. One made in
// place of a whiteout is a new directory in place of the lower layers'
// one, and so opaque: it shows nothing of theirs.
func mkdir(p string, mode os.FileMode, overWhiteout bool) error {
	if err := os.Mkdir(p, mode); err != nil {
		return err
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	if overWhiteout {
		return setOpaque(p)
	}
	return nil
}

// parents checks that every ancestor of rel is a real directory inside the root, not
// a symlink or file, so that nothing written for rel lands outside. Missing ancestors
// are created (mode 0755) if create is set, an error otherwise.
func (x *extractor) parents(rel string, create bool) error {
	parent := path.Dir(rel)
	if x.dirs[parent] {
		return nil
	}
	elems := strings.Split(parent, "/")
	for i := range elems {
		p := strings.Join(elems[:i+1], "/")
		if x.dirs[p] {
			continue
		}
		fi, err := os.Lstat(x.abs(p))
		whiteout := err == nil && isWhiteout(fi) && create
		switch {
		case (errors.Is(err, fs.ErrNotExist) || whiteout) && create:
			if whiteout {
				if err := os.Remove(x.abs(p)); err != nil {
					return err
				}
			}
			if err := mkdir(x.abs(p), 0o755, whiteout); err != nil {
				return err
			}
		case err != nil:
			return fmt.Errorf("%w: parent %q: %v", ErrInvalidImage, p, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w: parent %q is a symlink", ErrInvalidImage, p)
		case !fi.IsDir():
			return fmt.Errorf("%w: parent %q is not a directory", ErrInvalidImage, p)
		}
		x.dirs[p] = true
	}
	return nil
}

// remove deletes whatever an earlier entry left at rel, so a later entry replaces it.
func (x *extractor) remove(rel string) error {
	p := x.abs(rel)
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return os.Remove(p)
	}
	for d := range x.dirs {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			delete(x.dirs, d)
		}
	}
	return os.RemoveAll(p)
}

// applyMeta sets ownership, then mode (chown clears set-id bits), then xattrs.
// Overlayfs' own trusted.overlay.* xattrs are never taken from an image.
func applyMeta(p string, hdr *tar.Header) error {
	if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || strings.HasPrefix(name, "trusted.overlay.") {
			continue
		}
		if err := unix.Lsetxattr(p, name, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) || (hdr.Typeflag == tar.TypeSymlink && errors.Is(err, unix.EPERM)) {
				continue // a filesystem or file type that cannot hold it
			}
			return &os.PathError{Op: "setxattr " + name, Path: p, Err: err}
		}
	}
	return nil
}

func accessTime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

// setTimes sets p's times without following a symlink.
func setTimes(p string, atime, mtime time.Time) error {
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: p, Err: err}
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}
