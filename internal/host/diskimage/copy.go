package diskimage

import (
	"context"
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copyImage makes dst, an empty file, a copy of the first size bytes of
// src: a reflink (FICLONE) where the filesystem shares extents (btrfs,
// xfs), else a copy of the data only, found with SEEK_DATA and SEEK_HOLE,
// so the copy is as sparse as the image.
func copyImage(ctx context.Context, dst, src *os.File, size int64) error {
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err == nil {
		return nil
	}
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return &os.PathError{Op: "seek data", Path: src.Name(), Err: err}
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return &os.PathError{Op: "seek hole", Path: src.Name(), Err: err}
		}
		hole = min(hole, size)
		if err := copyRange(ctx, dst, src, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return dst.Truncate(size)
}

// copyChunk bounds one copy_file_range, so that a cancellation is seen
// within one chunk.
const copyChunk = 64 << 20

// copyRange copies n bytes at off of src to the same offset of dst, in
// the kernel where it can (copy_file_range), through a buffer where not.
func copyRange(ctx context.Context, dst, src *os.File, off, n int64) error {
	end := off + n
	for off < end {
		if err := ctx.Err(); err != nil {
			return err
		}
		in, out := off, off
		c, err := unix.CopyFileRange(int(src.Fd()), &in, int(dst.Fd()), &out, int(min(end-off, copyChunk)), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
				return copyBuffered(dst, src, off, end-off)
			}
			return &os.PathError{Op: "copy_file_range", Path: src.Name(), Err: err}
		}
		if c == 0 {
			return io.ErrUnexpectedEOF // src shrank under us
		}
		off += int64(c)
	}
	return nil
}

func copyBuffered(dst, src *os.File, off, n int64) error {
	w := io.NewOffsetWriter(dst, off)
	c, err := io.Copy(w, io.NewSectionReader(src, off, n))
	if err == nil && c != n {
		err = io.ErrUnexpectedEOF
	}
	return err
}
