// Package sparsefile writes a new file so that its blocks of zero bytes
// stay holes, which the filesystem allocates nothing for: the layers the
// image store unpacks (a sparse tar entry's holes and every zero block of
// its data) and the files `ws cp` downloads, whose holes cross the wire as
// zeros.
package sparsefile

import (
	"bytes"
	"errors"
	"io"
	"os"
)

// block is the granularity at which zero content becomes a hole: the block
// size of common host filesystems.
const block = 4096

var zeroBlock [block]byte

// Create creates the file p (it must not exist) with r's content, leaving
// holes where the content is zero.
func Create(p string, r io.Reader) (err error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := NewWriter(f)
	if _, err := io.Copy(w, r); err != nil {
		return err
	}
	return w.Finish()
}

// Writer writes an empty file from its start at an offset it keeps
// itself, skipping zero blocks, so that they stay holes; Finish gives the
// file its size.
type Writer struct {
	f   *os.File
	off int64
}

// NewWriter returns a Writer of f, which is empty.
func NewWriter(f *os.File) *Writer { return &Writer{f: f} }

func (w *Writer) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		// Skip zero pieces. The file is new and written in order, so what
		// is skipped reads back as zeros; a piece is at most the rest of
		// a block, so whole zero blocks stay holes whatever the sizes of
		// the writes.
		for len(p) > 0 {
			c := min(len(p), block-int(w.off%block))
			if !bytes.Equal(p[:c], zeroBlock[:c]) {
				break
			}
			w.off += int64(c)
			p = p[c:]
		}
		// Write the data up to the next zero piece in one call.
		end := 0
		for end < len(p) {
			c := min(len(p)-end, block-int((w.off+int64(end))%block))
			if bytes.Equal(p[end:end+c], zeroBlock[:c]) {
				break
			}
			end += c
		}
		if end > 0 {
			if _, err := w.f.WriteAt(p[:end], w.off); err != nil {
				return n - len(p), err
			}
			w.off += int64(end)
			p = p[end:]
		}
	}
	return n, nil
}

// Seek moves the write offset; tar.Reader uses it to skip a sparse entry's
// holes.
func (w *Writer) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += w.off
	default:
		return w.off, errors.New("sparsefile: unsupported whence")
	}
	if offset < 0 {
		return w.off, errors.New("sparsefile: negative offset")
	}
	w.off = offset
	return offset, nil
}

// Finish sets the file's size to the end of what was written, which a
// hole at its end would leave short. The file stays open.
func (w *Writer) Finish() error { return w.f.Truncate(w.off) }
