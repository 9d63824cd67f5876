package testutil

import (
	"io"
	"net"
	"testing"
	"time"
)

// SendHead opens a TCP connection to addr and writes head, a request's
// line and header (with whatever of its body a test sends), for a test of
// what a server does with a request whose body never comes whole. The
// connection is closed when the test ends.
func SendHead(t testing.TB, addr, head string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	return conn
}
