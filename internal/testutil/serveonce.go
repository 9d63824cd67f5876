package testutil

import (
	"net"
	"testing"
)

// ServeOnce listens on a new loopback TCP port, hands the first
// connection to serve and closes it once serve returns; the listener
// closes when the test ends. It returns the listener's address.
func ServeOnce(t testing.TB, serve func(c net.Conn)) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}()
	return ln.Addr().(*net.TCPAddr)
}

// ClosedURL returns the http URL of a loopback port nothing listens on.
func ClosedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}
