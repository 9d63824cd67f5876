package socks5_test

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/kibotos/kibotos/internal/host/socks5"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

// TestCloseWrite checks that a CONNECT stream's CloseWrite reaches the
// endpoint as the end of the TCP stream, over TLS too (after close_notify),
// and that the answer the endpoint sends after it still arrives.
func TestCloseWrite(t *testing.T) {
	serverTLS, ca := testtls.New(t, "127.0.0.1")
	for _, overTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", overTLS), func(t *testing.T) {
			addr := rawEndpoint(t, func(raw net.Conn) error {
				c := raw
				if overTLS {
					c = tls.Server(raw, serverTLS)
				}
				if err := expect(c, "greeting", []byte{5, 1, 0}); err != nil {
					return err
				}
				c.Write([]byte{5, 0})
				if err := expect(c, "request", []byte{5, 1, 0, 1, 192, 0, 2, 1, 0, 80}); err != nil {
					return err
				}
				c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0})
				req, err := io.ReadAll(c)
				if err != nil {
					return fmt.Errorf("reading to the end of the request: %w", err)
				}
				if overTLS {
					// close_notify ended the TLS stream; the TCP stream
					// must end as well.
					if n, err := raw.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
						return fmt.Errorf("after close_notify the TCP stream read %d bytes, %v; want its end", n, err)
					}
				}
				_, err = io.WriteString(c, "answer to "+string(req))
				return err
			})
			d := &socks5.Dialer{Endpoint: socks5.Endpoint{Address: addr}}
			if overTLS {
				d.Endpoint.TLS = &socks5.TLS{CACertPEM: ca}
			}
			c, err := d.DialContext(t.Context(), "tcp", "192.0.2.1:80")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, "request")
			if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if b, err := io.ReadAll(c); err != nil || string(b) != "answer to request" {
				t.Fatalf("after CloseWrite: %q, %v; want the answer and its end", b, err)
			}
		})
	}
}
