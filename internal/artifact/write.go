package artifact

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Writer writes an artifact to an io.Writer, streaming: it holds one
// file's extents map, never a file's content. The trailer's lines, one
// per regular file with its name (up to maxNameBytes), wait in an unlinked
// temporary file (os.TempDir) rather than memory; Close releases it.
type Writer struct {
	zw *zstd.Encoder
	tw *tar.Writer
	// sums writes the trailer's lines to spool, sumsBytes so far.
	sums      *bufio.Writer
	spool     *os.File
	sumsBytes int64
	entries   int
	// read counts the content bytes read from trees, for progress.
	read     int64
	progress func(read int64)
}

// NewWriter starts an artifact on w with its manifest entry. progress,
// when not nil, is called with the content bytes read so far as files
// are added.
func NewWriter(w io.Writer, manifest []byte, progress func(read int64)) (*Writer, error) {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderCRC(true))
	if err != nil {
		return nil, err
	}
	spool, err := os.CreateTemp("", "kibotos-transfer-sums-*")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(spool.Name()); err != nil {
		spool.Close()
		return nil, err
	}
	aw := &Writer{zw: zw, tw: tar.NewWriter(zw), sums: bufio.NewWriter(spool), spool: spool, progress: progress}
	if err := aw.AddFile(ManifestName, bytes.NewReader(manifest), int64(len(manifest))); err != nil {
		spool.Close()
		return nil, err
	}
	return aw, nil
}

// AddFile adds a regular file name of size bytes read from r (mode 0644,
// owned by root).
func (w *Writer) AddFile(name string, r io.Reader, size int64) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, Format: tar.FormatPAX,
		ModTime: time.Unix(0, 0)}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	h := sha256.New()
	if n, err := io.Copy(io.MultiWriter(w.tw, h), io.LimitReader(r, size)); err != nil {
		return err
	} else if n != size {
		return fmt.Errorf("artifact: %s: %d of %d bytes", name, n, size)
	}
	w.sum(h.Sum(nil), name)
	return nil
}

// sum adds the trailer's line of a regular file; an error writing it is
// the spool's, which Close returns.
func (w *Writer) sum(sum []byte, name string) {
	w.entries++
	n, _ := w.sums.WriteString(sumLine(sum, name))
	w.sumsBytes += int64(n)
}

// AddTree adds the directory root and everything below it under the
// section name prefix, without following symbolic links. root should be
// on a read-only mount: a file that changes while it is read is carried
// as it was read.
//
// It walks relative to directory descriptors (openat, fstatat, ...), so
// that how deep root itself sits takes nothing from the paths below it:
// each may be as long as Linux takes in one call (maxPathBytes). A path
// longer than that, which a guest can make only by working in relative
// paths, ends the walk with an error wrapping ENAMETOOLONG, before its
// entry is written. Each directory holds its descriptor while what it
// holds is walked: at most about 2,048 at once (maxPathBytes of one-byte
// names).
func (w *Writer) AddTree(ctx context.Context, prefix, root string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	dir := os.NewFile(uintptr(fd), root)
	defer dir.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: root, Err: err}
	}
	t := &treeWalk{w: w, ctx: ctx, links: map[[2]uint64]string{}}
	if err := t.add(fd, "", prefix, &st); err != nil {
		return err
	}
	return t.children(dir, "", prefix)
}

// treeWalk is one AddTree's walk.
type treeWalk struct {
	w   *Writer
	ctx context.Context
	// links maps a (device, inode) with more than one link to the name
	// of its first entry.
	links map[[2]uint64]string
}

// children adds what the open directory dir holds, in lexical order like
// filepath.WalkDir, each directory before what it holds. rel is dir's
// path inside the tree ("" for its root), name its entry's name.
func (t *treeWalk) children(dir *os.File, rel, name string) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return &os.PathError{Op: "readdirent", Path: name, Err: err}
	}
	slices.Sort(names)
	dirfd := int(dir.Fd())
	for _, base := range names {
		if err := t.ctx.Err(); err != nil {
			return err
		}
		childRel, childName := base, name+"/"+base
		if rel != "" {
			childRel = rel + "/" + base
		}
		if len(childRel) > maxPathBytes {
			return fmt.Errorf("artifact: %s: a path of %d bytes, longer than the %d Linux takes: %w",
				abbreviate(childName), len(childRel), maxPathBytes, unix.ENAMETOOLONG)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "lstat", Path: childName, Err: err}
		}
		if err := t.add(dirfd, base, childName, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: childName, Err: err}
		}
		child := os.NewFile(uintptr(fd), childName)
		err = t.children(child, childRel, childName)
		child.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// abbreviate shortens a long name for an error message, keeping its
// start and its end.
func abbreviate(name string) string {
	if len(name) <= 200 {
		return name
	}
	return name[:100] + "..." + name[len(name)-100:]
}

// add adds the entry name of one file of a tree: base in dirfd, or dirfd
// itself when base is "", whose status is st.
func (t *treeWalk) add(dirfd int, base, name string, st *unix.Stat_t) error {
	w := t.w
	hdr := &tar.Header{Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX, PAXRecords: map[string]string{}}
	format := st.Mode & unix.S_IFMT
	if format == unix.S_IFSOCK {
		// Not carried: neither it nor a hard link to it, which would
		// point at no entry.
		return nil
	}
	if format != unix.S_IFDIR && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := t.links[key]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.PAXRecords = tar.TypeLink, first, nil
			w.entries++
			return w.tw.WriteHeader(hdr)
		}
		t.links[key] = name
	}
	if err := readXattrs(dirfd, base, name, hdr.PAXRecords); err != nil {
		return err
	}
	switch format {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
	case unix.S_IFLNK:
		target, err := readlinkat(dirfd, base)
		if err != nil {
			return &os.PathError{Op: "readlink", Path: name, Err: err}
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if format == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	case unix.S_IFREG:
		return w.addRegular(dirfd, base, hdr, st.Size)
	}
	w.entries++
	return w.tw.WriteHeader(hdr)
}

// readlinkat returns the target of the symbolic link base in dirfd.
func readlinkat(dirfd int, base string) (string, error) {
	// A target is at most maxPathBytes: symlink(2) takes no longer.
	buf := make([]byte, maxPathBytes+1)
	n, err := unix.Readlinkat(dirfd, base, buf)
	if err != nil {
		return "", err
	}
	if n > maxPathBytes {
		return "", unix.ENAMETOOLONG
	}
	return string(buf[:n]), nil
}

// addRegular adds the data extents of the regular file base in dirfd.
func (w *Writer) addRegular(dirfd int, base string, hdr *tar.Header, size int64) error {
	fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: hdr.Name, Err: err}
	}
	f := os.NewFile(uintptr(fd), hdr.Name)
	defer f.Close()
	extents, err := dataExtents(f, size)
	if err != nil {
		return fmt.Errorf("artifact: extents of %s: %w", hdr.Name, err)
	}
	hdr.Typeflag = tar.TypeReg
	for _, e := range extents {
		hdr.Size += e[1]
	}
	if len(extents) != 1 || extents[0] != [2]int64{0, size} {
		if size == 0 {
			extents = nil
		} else {
			hdr.PAXRecords[paxSparse] = formatSparse(size, extents)
		}
	}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	h := sha256.New()
	out := io.MultiWriter(w.tw, h)
	for _, e := range extents {
		n, err := io.Copy(out, &countingReader{r: io.NewSectionReader(f, e[0], e[1]), w: w})
		if err != nil {
			return err
		}
		if n != e[1] {
			return fmt.Errorf("artifact: %s shrank while it was read", hdr.Name)
		}
	}
	w.sum(h.Sum(nil), hdr.Name)
	return nil
}

// countingReader reports what it reads to the Writer's progress.
type countingReader struct {
	r io.Reader
	w *Writer
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.w.read += int64(n)
	if c.w.progress != nil && n > 0 {
		c.w.progress(c.w.read)
	}
	return n, err
}

// dataExtents returns the data extents (offset, length) of a file of size
// bytes, found with SEEK_DATA and SEEK_HOLE; a file system without them
// reports the whole file as data.
func dataExtents(f *os.File, size int64) ([][2]int64, error) {
	if size == 0 {
		return [][2]int64{{0, 0}}, nil
	}
	fd := int(f.Fd())
	var out [][2]int64
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if errors.Is(err, unix.EINVAL) && off == 0 {
			return [][2]int64{{0, size}}, nil
		}
		if err != nil {
			return nil, err
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		end = min(end, size)
		if end > start {
			out = append(out, [2]int64{start, end - start})
		}
		off = end
	}
	return out, nil
}

// formatSparse is the KIBOTOS.sparse record of a file.
func formatSparse(size int64, extents [][2]int64) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(size, 10) + ":")
	for i, e := range extents {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(e[0], 10) + "," + strconv.FormatInt(e[1], 10))
	}
	return b.String()
}

// skippedXattrs name inodes of the exporting host: they mean nothing
// elsewhere.
var skippedXattrs = map[string]bool{"trusted.overlay.origin": true, "trusted.overlay.impure": true}

// readXattrs adds to records the extended attributes of base in dirfd
// (not following a link), or of dirfd itself when base is "", the entry
// name.
func readXattrs(dirfd int, base, name string, records map[string]string) error {
	// Through the descriptor's magic link, relative to it: getxattrat
	// and listxattrat need Linux 6.13, and f*xattr takes no O_PATH
	// descriptor, the only kind a symbolic link opens as (and the only
	// safe one for a device or a fifo).
	p := "/proc/self/fd/" + strconv.Itoa(dirfd)
	list, get := unix.Listxattr, unix.Getxattr // dirfd itself, the link followed
	if base != "" {
		p += "/" + base
		list, get = unix.Llistxattr, unix.Lgetxattr
	}
	size, err := list(p, nil)
	if errors.Is(err, unix.ENOTSUP) || size == 0 {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "listxattr", Path: name, Err: err}
	}
	buf := make([]byte, size)
	if size, err = list(p, buf); err != nil {
		return &os.PathError{Op: "listxattr", Path: name, Err: err}
	}
	for _, attr := range strings.Split(strings.TrimRight(string(buf[:size]), "\x00"), "\x00") {
		if attr == "" || skippedXattrs[attr] {
			continue
		}
		n, err := get(p, attr, nil)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "getxattr " + attr, Path: name, Err: err}
		}
		val := make([]byte, n)
		if n, err = get(p, attr, val); err != nil {
			return &os.PathError{Op: "getxattr " + attr, Path: name, Err: err}
		}
		records[paxXattr+attr] = string(val[:n])
	}
	return nil
}

// Close writes the trailer and ends the archive and the zstd stream; it
// does not close the underlying writer.
func (w *Writer) Close() error {
	defer w.spool.Close()
	if err := w.sums.Flush(); err != nil {
		return err
	}
	if _, err := w.spool.Seek(0, io.SeekStart); err != nil {
		return err
	}
	end := entriesLine(w.entries)
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: TrailerName, Mode: 0o644, Size: w.sumsBytes + int64(len(end)),
		Format: tar.FormatPAX, ModTime: time.Unix(0, 0)}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.Copy(w.tw, w.spool); err != nil {
		return err
	}
	if _, err := io.WriteString(w.tw, end); err != nil {
		return err
	}
	if err := w.tw.Close(); err != nil {
		return err
	}
	return w.zw.Close()
}
