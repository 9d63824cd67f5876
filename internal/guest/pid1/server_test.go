package pid1

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// startServer runs a Server on a socket in a temp dir and returns the
// socket path.
func startServer(t *testing.T, s *Server) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return sock
}

func dial(t *testing.T, sock string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c, bufio.NewReader(c)
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) string {
	t.Helper()
	if _, err := c.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("after %q: %v", line, err)
	}
	return got
}

func TestPing(t *testing.T) {
	id := NewBootID()
	if len(id) != 32 || id == NewBootID() {
		t.Fatalf("boot id %q", id)
	}
	sock := startServer(t, &Server{BootID: id})
	c, r := dial(t, sock)
	for range 3 { // several commands on one connection
		if got, want := roundTrip(t, c, r, "PING\n"), "READY "+id+"\n"; got != want {
			t.Fatalf("PING: got %q, want %q", got, want)
		}
	}
	c2, r2 := dial(t, sock)
	if got := roundTrip(t, c2, r2, "PING\r\n"); got != "READY "+id+"\n" {
		t.Fatalf("PING with CRLF: %q", got)
	}
}

func TestErrors(t *testing.T) {
	sock := startServer(t, &Server{BootID: "x"})
	c, r := dial(t, sock)
	for _, line := range []string{"HELLO\n", "STOP\n", "STOP -1\n", "STOP abc\n", "ping\n"} {
		if got := roundTrip(t, c, r, line); !strings.HasPrefix(got, "ERR ") {
			t.Errorf("%q: got %q, want ERR", line, got)
		}
	}
	// The connection still works after errors.
	if got := roundTrip(t, c, r, "PING\n"); got != "READY x\n" {
		t.Fatalf("PING after errors: %q", got)
	}
	// An over-long line is refused and the connection closed.
	c2, r2 := dial(t, sock)
	if got := roundTrip(t, c2, r2, strings.Repeat("A", 2*guestabi.MaxProbeLine)+"\n"); got != "ERR line too long\n" {
		t.Fatalf("long line: %q", got)
	}
}

func TestStop(t *testing.T) {
	var calls atomic.Int32
	var gotGrace atomic.Int64
	s := &Server{BootID: "b", Stop: func(grace time.Duration) error {
		calls.Add(1)
		gotGrace.Store(int64(grace))
		time.Sleep(50 * time.Millisecond)
		return nil
	}}
	sock := startServer(t, s)
	select {
	case <-s.Done():
		t.Fatal("Done before STOP")
	default:
	}
	// Two concurrent STOPs: the procedure runs once, both are answered.
	answers := make(chan string, 2)
	for range 2 {
		c, r := dial(t, sock)
		go func() {
			c.Write([]byte("STOP 1500\n"))
			got, _ := r.ReadString('\n')
			answers <- got
		}()
	}
	for range 2 {
		if got := <-answers; got != "STOPPED\n" {
			t.Fatalf("STOP: got %q", got)
		}
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after STOPPED")
	}
	if calls.Load() != 1 {
		t.Fatalf("Stop ran %d times", calls.Load())
	}
	if time.Duration(gotGrace.Load()) != 1500*time.Millisecond {
		t.Fatalf("grace %v", time.Duration(gotGrace.Load()))
	}
}

func TestStopNow(t *testing.T) {
	var calls atomic.Int32
	s := &Server{Stop: func(time.Duration) error { calls.Add(1); return nil }}
	sock := startServer(t, s)
	if err := s.StopNow(time.Second); err != nil {
		t.Fatal(err)
	}
	<-s.Done()
	c, r := dial(t, sock)
	if got := roundTrip(t, c, r, "STOP 10\n"); got != "STOPPED\n" {
		t.Fatalf("STOP after StopNow: %q", got)
	}
	if calls.Load() != 1 {
		t.Fatalf("Stop ran %d times", calls.Load())
	}
}

func TestTerminateAllRefusesOutsidePID1(t *testing.T) {
	if err := NewReaper().TerminateAll(time.Millisecond); err == nil {
		t.Fatal("TerminateAll outside PID 1 succeeded")
	}
}

func TestProcState(t *testing.T) {
	st, ok := procState(1)
	if !ok || st == 0 {
		t.Fatalf("procState(1) = %q, %v", st, ok)
	}
}
