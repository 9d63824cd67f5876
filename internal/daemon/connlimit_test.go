package daemon

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
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
