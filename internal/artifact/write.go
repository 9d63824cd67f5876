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
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Writer writes an artifact to an io.Writer, streaming: it holds one
// file's extents map, never a file's content. The trailer's lines, one
// per regular file with its name (up to 4096 bytes), wait in an unlinked
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
func (w *Writer) AddTree(ctx context.Context, prefix, root string) error {
	links := map[[2]uint64]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := prefix
		if rel != "." {
			name = prefix + "/" + filepath.ToSlash(rel)
		}
		return w.addPath(p, name, links)
	})
}

// addPath adds one file of a tree.
func (w *Writer) addPath(p, name string, links map[[2]uint64]string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: p, Err: err}
	}
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
		if first, ok := links[key]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.PAXRecords = tar.TypeLink, first, nil
			w.entries++
			return w.tw.WriteHeader(hdr)
		}
		links[key] = name
	}
	if err := readXattrs(p, hdr.PAXRecords); err != nil {
		return err
	}
	switch format {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
	case unix.S_IFLNK:
		target, err := os.Readlink(p)
		if err != nil {
			return err
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
		return w.addRegular(p, hdr, st.Size)
	}
	w.entries++
	return w.tw.WriteHeader(hdr)
}

// addRegular adds a regular file's data extents.
func (w *Writer) addRegular(p string, hdr *tar.Header, size int64) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	extents, err := dataExtents(f, size)
	if err != nil {
		return fmt.Errorf("artifact: extents of %s: %w", p, err)
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
			return fmt.Errorf("artifact: %s shrank while it was read", p)
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

// readXattrs adds the extended attributes of p (not following a link) to
// records.
func readXattrs(p string, records map[string]string) error {
	size, err := unix.Llistxattr(p, nil)
	if errors.Is(err, unix.ENOTSUP) || size == 0 {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "llistxattr", Path: p, Err: err}
	}
	buf := make([]byte, size)
	if size, err = unix.Llistxattr(p, buf); err != nil {
		return &os.PathError{Op: "llistxattr", Path: p, Err: err}
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:size]), "\x00"), "\x00") {
		if name == "" || skippedXattrs[name] {
			continue
		}
		n, err := unix.Lgetxattr(p, name, nil)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "lgetxattr " + name, Path: p, Err: err}
		}
		val := make([]byte, n)
		if n, err = unix.Lgetxattr(p, name, val); err != nil {
			return &os.PathError{Op: "lgetxattr " + name, Path: p, Err: err}
		}
		records[paxXattr+name] = string(val[:n])
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
