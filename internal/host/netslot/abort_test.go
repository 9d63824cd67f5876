package netslot

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"testing"

	"github.com/kibotos/kibotos/internal/host/socks5"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

// A stream through a TLS Egress that the slot cuts short is reset, not
// ended with close_notify, which the Egress would read as the stream's
// end: a cut upload must not arrive as complete.
func TestAbortOverTLSSendsNoCloseNotify(t *testing.T) {
	serverTLS, ca := testtls.New(t, "127.0.0.1")
	l, err := tls.Listen("tcp", "127.0.0.1:0", serverTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			defer c.Close()
			_, err = io.ReadAll(c)
		}
		got <- err
	}()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(ca))
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if _, err := io.WriteString(c, "partial upload"); err != nil {
		t.Fatal(err)
	}
	abort(&socks5.TLSStream{Conn: c})
	if err := <-got; err == nil {
		t.Fatal("the Egress read a stream the slot cut to its end, want an error")
	}
}
