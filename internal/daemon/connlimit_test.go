package daemon

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/server"
)

// TestLimitedListener: a listener holding its limit of connections
// accepts the next only once one closes, and a Close ends an Accept
// waiting at the limit, as a shutdown needs.
func TestLimitedListener(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := limitConnections(tcp, 2)
	defer ln.Close()
	accepted := make(chan net.Conn, 3)
	ended := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				ended <- err
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	next := func() net.Conn {
		t.Helper()
		select {
		case c := <-accepted:
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("a connection under the limit was not accepted")
			return nil
		}
	}
	first, second := next(), next()
	defer second.Close()
	// net/http looks for these on a *net.TCPConn: ReadFrom splices a
	// response copied from a socket, CloseWrite sends a FIN first.
	if _, ok := first.(io.ReaderFrom); !ok {
		t.Error("an accepted connection is no io.ReaderFrom")
	}
	if _, ok := first.(interface{ CloseWrite() error }); !ok {
		t.Error("an accepted connection has no CloseWrite")
	}
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted while two were open")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	third := next()
	defer third.Close()

	ln.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the Accept waiting at the limit")
	}
}

// TestFullListenerClosesAnIdleConnection: a listener at its limit makes
// room for a new client by closing a connection idle for shedAfter, never
// one with a request in flight; without it, connections kept idle after
// a request each held the listener for the server's idle timeout.
func TestFullListenerClosesAnIdleConnection(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := limitConnections(tcp, 2)
	ln.shedAfter = 300 * time.Millisecond
	hold := make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() {
		served <- server.Serve(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				<-hold
			}
			io.WriteString(w, "ok")
		}), time.Second)
	}()
	t.Cleanup(func() { close(hold); cancel(); <-served })
	request := func(c net.Conn, path string) {
		t.Helper()
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	answered := func(c net.Conn, r *bufio.Reader) error {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(r, nil)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	busy, _ := dial()
	request(busy, "/hold")
	idle, idleR := dial()
	request(idle, "/")
	if err := answered(idle, idleR); err != nil {
		t.Fatal(err)
	}
	late, lateR := dial()
	request(late, "/")
	if err := answered(late, lateR); err != nil {
		t.Fatalf("a new client of a full listener with an idle connection: %v, want its answer", err)
	}
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := idleR.ReadByte(); err != io.EOF {
		t.Errorf("the idle connection: %v, want it closed", err)
	}
	busy.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := busy.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the connection with a request in flight: %v, want it open", err)
	}
}
