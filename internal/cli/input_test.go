package cli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOpenFileOfANamedPipe: opening a named pipe waits for a writer, and
// an interrupt (ctx) ends the wait; a writer that comes is read.
func TestOpenFileOfANamedPipe(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, _, err := openFile(ctx, fifo); !errors.Is(err, context.Canceled) {
		t.Fatalf("a named pipe without a writer, interrupted: %v, want canceled", err)
	}
	// Another pipe: the interrupted open of the first still waits, and a
	// writer of that one might meet it instead.
	fifo = filepath.Join(t.TempDir(), "fifo2")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.WriteString("piped")
			w.Close()
		}
	}()
	f, st, err := openFile(context.Background(), fifo)
	if err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("a named pipe with a writer: %v, %v", st, err)
	}
	defer f.Close()
	buf := make([]byte, 16)
	if n, _ := f.Read(buf); string(buf[:n]) != "piped" {
		t.Errorf("read %q from the pipe", buf[:n])
	}
}
