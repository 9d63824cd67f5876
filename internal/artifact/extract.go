package artifact

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Extract reads an artifact from r and writes the entries of each section
// that roots names into that directory, which must exist (a fresh file
// system, where only directories may exist before: their attributes are
// set from the artifact, and lost+found, which mkfs makes, gives way to
// an entry of another type). Owners, modes, extended attributes, times,
// hard links and holes are restored. It returns the manifest once the whole
// artifact verified; on any error the directories hold a partial tree,
// which the caller discards.
func Extract(ctx context.Context, r io.Reader, roots map[string]string) (*ctrlv1.TransferManifest, error) {
	xs := map[string]*extractor{}
	defer func() {
		for _, x := range xs {
			x.close()
		}
	}()
	for section, dir := range roots {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: dir, Err: err}
		}
		xs[section] = &extractor{root: fd, parent: -1}
	}
	m, err := Walk(ctx, r, func(e *Entry, content io.Reader) error {
		x := xs[e.Section]
		if x == nil {
			return nil
		}
		return x.entry(e, content)
	})
	if err != nil {
		return nil, err
	}
	for _, x := range xs {
		if err := x.finish(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// lostFound is the directory mkfs makes at a filesystem's root.
const lostFound = "lost+found"

// extractor writes one section below root.
type extractor struct {
	root int
	// parent caches the directory of the latest entry.
	parentRel string
	parent    int
	// dirs are the directories, whose times are set last.
	dirs []dirTimes
}

type dirTimes struct {
	rel   string
	mtime unix.Timespec
}

func (x *extractor) close() {
	if x.parent >= 0 {
		unix.Close(x.parent)
	}
	unix.Close(x.root)
}

// dir opens a directory of the section below root without following any
// link.
func (x *extractor) dir(rel string) (int, error) {
	if rel == "" || rel == "." {
		return x.root, nil
	}
	if x.parent >= 0 && x.parentRel == rel {
		return x.parent, nil
	}
	fd, err := unix.Openat2(x.root, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return -1, invalid("directory %s of an entry is not a directory of the archive: %v", rel, err)
	}
	if x.parent >= 0 {
		unix.Close(x.parent)
	}
	x.parentRel, x.parent = rel, fd
	return fd, nil
}

// entry writes one entry.
func (x *extractor) entry(e *Entry, content io.Reader) error {
	hdr := e.Header
	if e.Rel == "" {
		// The section's root: its attributes only.
		return x.attributes(x.root, "", e, true)
	}
	parentRel, base := path.Split(e.Rel)
	dirfd, err := x.dir(path.Clean(parentRel))
	if err != nil {
		return err
	}
	if e.Rel == lostFound && hdr.Typeflag != tar.TypeDir {
		// mkfs made it a directory; the exported filesystem held
		// something else there.
		if err := unix.Unlinkat(x.root, lostFound, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("artifact: replacing %s: %w", lostFound, err)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(dirfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("artifact: mkdir %s: %w", e.Rel, err)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return invalid("%s is not a directory where the archive makes one", e.Rel)
		}
	case tar.TypeReg:
		return x.regular(dirfd, base, e, content)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, dirfd, base); err != nil {
			return fmt.Errorf("artifact: symlink %s: %w", e.Rel, err)
		}
	case tar.TypeLink:
		_, targetRel, _ := strings.Cut(hdr.Linkname, "/")
		tparent, tbase := path.Split(targetRel)
		tfd, err := unix.Openat2(x.root, path.Clean(tparent), &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		if err != nil {
			return invalid("hard link %s: its target %s is not in the archive: %v", e.Rel, hdr.Linkname, err)
		}
		err = unix.Linkat(tfd, tbase, dirfd, base, 0)
		unix.Close(tfd)
		if err != nil {
			return fmt.Errorf("artifact: link %s to %s: %w", e.Rel, hdr.Linkname, err)
		}
		return nil // a link shares its target's attributes
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := uint32(unix.S_IFIFO)
		switch hdr.Typeflag {
		case tar.TypeChar:
			kind = unix.S_IFCHR
		case tar.TypeBlock:
			kind = unix.S_IFBLK
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(dirfd, base, kind|0o600, int(dev)); err != nil {
			return fmt.Errorf("artifact: mknod %s: %w", e.Rel, err)
		}
	}
	return x.attributes(dirfd, base, e, hdr.Typeflag == tar.TypeDir)
}

// regular writes a regular file: its logical size, then each extent at
// its offset, so that holes stay holes.
func (x *extractor) regular(dirfd int, base string, e *Entry, content io.Reader) error {
	fd, err := unix.Openat(dirfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("artifact: create %s: %w", e.Rel, err)
	}
	f := os.NewFile(uintptr(fd), e.Rel)
	defer f.Close()
	if err := f.Truncate(e.Size); err != nil {
		return err
	}
	for _, ext := range e.Extents {
		w := io.NewOffsetWriter(f, ext[0])
		if n, err := io.CopyN(w, content, ext[1]); err != nil {
			if n < ext[1] && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
				return invalid("it is truncated inside %s", e.Header.Name)
			}
			return err
		}
	}
	return x.attributes(dirfd, base, e, false)
}

// attributes sets owner, mode, extended attributes and (except for
// directories, done last) times of the entry base in dirfd; base "" is
// dirfd itself.
func (x *extractor) attributes(dirfd int, base string, e *Entry, isDir bool) error {
	hdr := e.Header
	flags := unix.AT_SYMLINK_NOFOLLOW
	target := base
	if base == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Fchownat(dirfd, target, hdr.Uid, hdr.Gid, flags); err != nil {
		return fmt.Errorf("artifact: chown %s: %w", e.Header.Name, err)
	}
	symlink := hdr.Typeflag == tar.TypeSymlink
	if !symlink {
		// Through an O_PATH descriptor of the entry itself, so that no
		// link is followed.
		fd, err := unix.Openat(dirfd, orDot(target), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("artifact: open %s: %w", e.Header.Name, err)
		}
		proc := "/proc/self/fd/" + strconv.Itoa(fd)
		err = unix.Chmod(proc, uint32(hdr.Mode&0o7777))
		if err == nil {
			for _, name := range sortedKeys(e.Xattrs) {
				if err = unix.Setxattr(proc, name, []byte(e.Xattrs[name]), 0); err != nil {
					err = fmt.Errorf("artifact: xattr %s of %s: %w", name, e.Header.Name, err)
					break
				}
			}
		}
		unix.Close(fd)
		if err != nil {
			return err
		}
	} else {
		for _, name := range sortedKeys(e.Xattrs) {
			p := "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + base
			if err := unix.Lsetxattr(p, name, []byte(e.Xattrs[name]), 0); err != nil {
				return fmt.Errorf("artifact: xattr %s of %s: %w", name, e.Header.Name, err)
			}
		}
	}
	ts := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	if isDir {
		x.dirs = append(x.dirs, dirTimes{rel: e.Rel, mtime: ts})
		return nil
	}
	return unix.UtimesNanoAt(dirfd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

func orDot(name string) string {
	if name == "" {
		return "."
	}
	return name
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// finish sets the directories' times, deepest first, once nothing more is
// written into them.
func (x *extractor) finish() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		fd, err := x.dir(d.rel)
		if err != nil {
			return err
		}
		if err := unix.UtimesNanoAt(fd, ".", []unix.Timespec{d.mtime, d.mtime}, 0); err != nil {
			return fmt.Errorf("artifact: times of %s: %w", d.rel, err)
		}
	}
	return nil
}
