package imagestore

import (
	"bytes"
	"errors"
	"io"
	"os"
)

// holeBlock is the granularity at which zero content becomes a hole: the block
// size of common host filesystems.
const holeBlock = 4096

var zeroBlock [holeBlock]byte

// writeSparse creates the file p with r's content, leaving holes where the
// content is zero: the holes of a sparse tar entry (tar.Reader seeks over them
// through holeWriter) and every zero block of the data.
func writeSparse(p string, r io.Reader) (err error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := &holeWriter{f: f}
	if _, err := io.Copy(w, r); err != nil {
		return err
	}
	return f.Truncate(w.off)
}

// holeWriter writes at an offset it keeps itself, skipping zero blocks, so
// that they stay holes; the caller truncates the file to off at the end.
type holeWriter struct {
	f   *os.File
	off int64
}

func (w *holeWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		// Skip zero pieces. The file is new and written in order, so what
		// is skipped reads back as zeros; a piece is at most the rest of
		// a block, so whole zero blocks stay holes whatever the sizes of
		// the writes.
		for len(p) > 0 {
			c := min(len(p), holeBlock-int(w.off%holeBlock))
			if !bytes.Equal(p[:c], zeroBlock[:c]) {
				break
			}
			w.off += int64(c)
			p = p[c:]
		}
		// Write the data up to the next zero piece in one call.
		end := 0
		for end < len(p) {
			c := min(len(p)-end, holeBlock-int((w.off+int64(end))%holeBlock))
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
func (w *holeWriter) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += w.off
	default:
		return w.off, errors.New("holeWriter: unsupported whence")
	}
	if offset < 0 {
		return w.off, errors.New("holeWriter: negative offset")
	}
	w.off = offset
	return offset, nil
}
