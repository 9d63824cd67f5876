package chunked

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestSend: chunks of the size, the last one short; a read error and a
// send error each stop it and come back on their own side.
func TestSend(t *testing.T) {
	var sizes []int
	var got bytes.Buffer
	read, rerr, serr := Send(bytes.NewReader(make([]byte, 7)), 3, func(c []byte) error {
		sizes = append(sizes, len(c))
		got.Write(c)
		return nil
	})
	if read != 7 || rerr != nil || serr != nil || len(sizes) != 3 || sizes[2] != 1 || got.Len() != 7 {
		t.Errorf("Send = %d, %v, %v; chunks %v", read, rerr, serr, sizes)
	}

	boom := errors.New("boom")
	if _, rerr, serr := Send(iotest.ErrReader(boom), 3, func([]byte) error { return nil }); rerr != boom || serr != nil {
		t.Errorf("read error: %v, %v", rerr, serr)
	}
	if read, rerr, serr := Send(bytes.NewReader(make([]byte, 7)), 3, func([]byte) error { return io.EOF }); read != 3 || rerr != nil || serr != io.EOF {
		t.Errorf("send error: %d, %v, %v", read, rerr, serr)
	}
}
