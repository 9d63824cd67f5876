package sdk

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestRereader(t *testing.T) {
	data := []byte("0123456789abcdefghij")
	src := &onceReader{r: bytes.NewReader(data)}
	r := newRereader(src, 16)
	first := r.next()
	buf := make([]byte, 6)
	if n, err := io.ReadFull(first, buf); n != 6 || err != nil {
		t.Fatalf("the first attempt read %d, %v", n, err)
	}
	if !r.restart(t.Context()) {
		t.Fatal("6 bytes read of 16 held: restart refused")
	}
	if _, err := first.Read(buf); !errors.Is(err, errAttemptEnded) {
		t.Errorf("the restarted attempt read on: %v, want errAttemptEnded", err)
	}
	got, err := io.ReadAll(r.next())
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("the second attempt read %q, %v; want the whole stream", got, err)
	}

	// Past the bound nothing can be read again.
	r = newRereader(bytes.NewReader(data), 16)
	if _, err := io.ReadAll(r.next()); err != nil {
		t.Fatal(err)
	}
	if r.restart(t.Context()) {
		t.Error("20 bytes read of 16 held: restart allowed")
	}
}
