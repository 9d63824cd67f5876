package cli

import (
	"bytes"
	"os"
)

// holeBlock is the size of the blocks a download writes: a block of zero
// bytes, aligned on its size in the file, is left a hole.
const holeBlock = 64 << 10

// zeroBlock is a holeBlock of zero bytes, to compare blocks with.
var zeroBlock [holeBlock]byte

// sparseWriter writes a file from its start, in blocks of holeBlock, and
// leaves each block of zero bytes unwritten, a hole the filesystem
// allocates nothing for, as `cp --sparse=auto` does: the holes of a file
// in a workspace cross the wire as zeros (its tar and the file API send
// them so), and without this they would take their whole size here. Flush
// ends the file.
type sparseWriter struct {
	f   *os.File
	off int64  // where buf begins in the file
	buf []byte // the block being filled, of capacity holeBlock
}

// reset makes w write f, which is empty, from its start, reusing w's
// block.
func (w *sparseWriter) reset(f *os.File) {
	if w.buf == nil {
		w.buf = make([]byte, 0, holeBlock)
	}
	w.f, w.off, w.buf = f, 0, w.buf[:0]
}

// Write writes p after what was written before, holding back the end of a
// block that is not full yet.
func (w *sparseWriter) Write(p []byte) (int, error) {
	for done := 0; done < len(p); {
		k := copy(w.buf[len(w.buf):cap(w.buf)], p[done:])
		w.buf = w.buf[:len(w.buf)+k]
		if len(w.buf) == cap(w.buf) {
			if err := w.writeBlock(); err != nil {
				return done, err
			}
		}
		done += k
	}
	return len(p), nil
}

// writeBlock writes the block held, unless it is all zeros.
func (w *sparseWriter) writeBlock() error {
	var err error
	if !bytes.Equal(w.buf, zeroBlock[:len(w.buf)]) {
		_, err = w.f.WriteAt(w.buf, w.off)
	}
	w.off += int64(len(w.buf))
	w.buf = w.buf[:0]
	return err
}

// Flush writes the last, partial block and sets the file's size, which a
// hole at its end would not: the file holds all that Write was given. The
// file stays open.
func (w *sparseWriter) Flush() error {
	if err := w.writeBlock(); err != nil {
		return err
	}
	return w.f.Truncate(w.off)
}
