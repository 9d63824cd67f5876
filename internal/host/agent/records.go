package agent

import "encoding/binary"

// recordFormat is how a byte stream frames its records: a header of
// headerSize bytes, which says how many bytes of record follow it.
type recordFormat struct {
	headerSize int
	length     func(header []byte) uint32
}

var (
	// connectEnvelopes are the messages of a Connect or gRPC stream: a
	// flag byte and a 4-byte big-endian length.
	connectEnvelopes = recordFormat{5, func(h []byte) uint32 { return binary.BigEndian.Uint32(h[1:]) }}
	// http2Frames are HTTP/2's frames: a 3-byte length, the type, the
	// flags and the stream.
	http2Frames = recordFormat{9, func(h []byte) uint32 { return uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2]) }}
)

// recordFollower follows where the records of a stream begin and end, as
// its bytes pass, whatever reads they come in.
type recordFollower struct {
	format recordFormat
	header [9]byte // the bytes of the next header read so far: got
	got    int
	left   uint32 // of the current record's bytes, those still to come
}

// follow follows b, the stream's next bytes, calling each (when not nil)
// with the header of each record that begins in it; an error of each ends
// it.
func (f *recordFollower) follow(b []byte, each func(header []byte) error) error {
	for len(b) > 0 {
		if f.left > 0 {
			k := min(uint32(len(b)), f.left)
			f.left -= k
			b = b[k:]
			continue
		}
		k := copy(f.header[f.got:f.format.headerSize], b)
		f.got += k
		b = b[k:]
		if f.got < f.format.headerSize {
			return nil
		}
		h := f.header[:f.format.headerSize]
		f.left, f.got = f.format.length(h), 0
		if each != nil {
			if err := each(h); err != nil {
				return err
			}
		}
	}
	return nil
}

// between reports whether the stream is between two records.
func (f *recordFollower) between() bool { return f.got == 0 && f.left == 0 }
