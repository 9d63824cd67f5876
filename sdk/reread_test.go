package sdk

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
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
	if err := r.restart(t.Context()); err != nil {
		t.Fatalf("6 bytes read of 16 held: restart refused: %v", err)
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
	if err := r.restart(t.Context()); !errors.Is(err, errNotHeld) {
		t.Errorf("20 bytes read of 16 held: restart: %v, want errNotHeld", err)
	}

	// A stream read to its end is not read again (onceReader fails
	// then), and one that failed fails the restart.
	r = newRereader(&onceReader{r: bytes.NewReader(data)}, 64)
	if _, err := io.ReadAll(r.next()); err != nil {
		t.Fatal(err)
	}
	if err := r.restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(r.next()); err != nil || !bytes.Equal(got, data) {
		t.Errorf("after the end, the next attempt read %q, %v; want the whole stream", got, err)
	}
	broken := errors.New("the source broke")
	r = newRereader(io.MultiReader(bytes.NewReader(data[:4]), iotest.ErrReader(broken)), 64)
	io.ReadAll(r.next())
	if err := r.restart(t.Context()); !errors.Is(err, broken) {
		t.Errorf("a restart after the stream failed: %v, want its failure", err)
	}
}
