package socks5_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/host/socks5"
	"github.com/kibotos/kibotos/internal/host/socks5/socks5test"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

func TestUDPAssociate(t *testing.T) {
	echo := echoUDP(t, "127.0.0.1:0")
	cfg, ca := testtls.New(t, "127.0.0.1")
	for _, overTLS := range []bool{false, true} {
		name := "plain"
		if overTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			o := socks5test.Options{Username: user, Password: password, UDP: true}
			d := &socks5.Dialer{}
			if overTLS {
				o.TLS = cfg
				d.Endpoint.TLS = &socks5.TLS{CACertPEM: ca}
			}
			srv := socks5test.Start(t, "127.0.0.1:0", o)
			d.Endpoint.Address, d.Endpoint.Username, d.Endpoint.Password = srv.Addr(), user, password
			c, err := d.DialContext(t.Context(), "udp", echo)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.RemoteAddr().String(); got != echo {
				t.Errorf("RemoteAddr() = %s, want %s", got, echo)
			}
			for _, msg := range []string{"one", "two", "three"} {
				datagramTrip(t, c, msg)
			}
			if n := srv.UDPDatagrams(); n != 3 {
				t.Errorf("UDPDatagrams() = %d, want 3", n)
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Read after Close: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestUDPHostnameDestination checks that a hostname destination is sent for
// the relay to resolve and that replies from the address it resolved to are
// delivered.
func TestUDPHostnameDestination(t *testing.T) {
	echo := echoUDP(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(echo)
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{UDP: true})
	c := dialUDP(t, dialer(srv), net.JoinHostPort("localhost", port))
	datagramTrip(t, c, "by name")
}

// TestUDPDatagrams plays the relay to check the header of a sent datagram
// (RFC 1928 section 7) and that Read drops datagrams that are malformed,
// fragmented or from another address than the destination.
func TestUDPDatagrams(t *testing.T) {
	relay, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	port := relay.LocalAddr().(*net.UDPAddr).Port
	addr := rawEndpoint(t, func(c net.Conn) error {
		c.Write([]byte{5, 0})
		c.Write([]byte{5, 0, 0, 1, 127, 0, 0, 1, byte(port >> 8), byte(port)})
		_, _ = io.Copy(io.Discard, c)
		return nil
	})
	c := dialUDP(t, &socks5.Dialer{Endpoint: socks5.Endpoint{Address: addr}}, "192.0.2.1:53")
	c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := c.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	relay.SetDeadline(time.Now().Add(ioTimeout))
	buf := make([]byte, 1<<16)
	n, client, err := relay.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	dest := []byte{0, 0, 0, 1, 192, 0, 2, 1, 0, 53} // RSV, FRAG, ATYP, 192.0.2.1, 53
	if want := append(dest, "query"...); !bytes.Equal(buf[:n], want) {
		t.Fatalf("datagram = % x, want % x", buf[:n], want)
	}
	for _, d := range [][]byte{
		append([]byte{0, 0, 0, 1, 192, 0, 2, 2, 0, 53}, "other address"...),
		append([]byte{0, 0, 0, 1, 192, 0, 2, 1, 0, 54}, "other port"...),
		append([]byte{0, 0, 1, 1, 192, 0, 2, 1, 0, 53}, "fragment"...),
		{0, 0, 0, 9, 1},
		append(dest, "answer"...),
	} {
		if _, err := relay.WriteToUDPAddrPort(d, client); err != nil {
			t.Fatal(err)
		}
	}
	n, err = c.Read(buf)
	if err != nil || string(buf[:n]) != "answer" {
		t.Errorf("Read = %q, %v, want \"answer\"", buf[:n], err)
	}
}

// TestUDPUnspecifiedRelay checks that a relay answered as 0.0.0.0 is sent
// to at the endpoint's own address, which the dial check sees.
func TestUDPUnspecifiedRelay(t *testing.T) {
	echo := echoUDP(t, "127.0.0.1:0")
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{UDP: true, UnspecifiedRelay: true})
	rec := &checkRecorder{}
	d := dialer(srv)
	d.Check = rec.check
	datagramTrip(t, dialUDP(t, d, echo), "substituted")
	lo := netip.MustParseAddr("127.0.0.1")
	if got, want := rec.addrs(), []netip.Addr{lo, lo}; !slices.Equal(got, want) {
		t.Errorf("checked %v, want the endpoint and the relay, %v", got, want)
	}
}

// TestUDPCheckRemovesRelay checks that a relay address the dial check
// refuses fails the association.
func TestUDPCheckRemovesRelay(t *testing.T) {
	requireIPv6(t)
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{UDP: true, RelayIP: netip.MustParseAddr("::1")})
	rec := &checkRecorder{refuse: netip.Addr.Is6}
	d := dialer(srv)
	d.Check = rec.check
	_, err := d.DialContext(t.Context(), "udp", echoUDP(t, "127.0.0.1:0"))
	if e := wantKind(t, err, socks5.UDPAssociationFailed); !errors.Is(e, errRefused) {
		t.Errorf("err = %v, want it to wrap the check's error", err)
	}
	if got, want := rec.addrs(), []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}; !slices.Equal(got, want) {
		t.Errorf("checked %v, want %v", got, want)
	}
}

// TestUDPAssociationEnded checks that an association whose control
// connection the endpoint closes stops with ErrAssociationEnded.
func TestUDPAssociationEnded(t *testing.T) {
	relay, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	port := relay.LocalAddr().(*net.UDPAddr).Port
	closeCtrl := make(chan struct{})
	addr := rawEndpoint(t, func(c net.Conn) error {
		if err := expect(c, "greeting", []byte{5, 1, 0}); err != nil {
			return err
		}
		c.Write([]byte{5, 0})
		if err := expect(c, "request", []byte{5, 3, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
			return err
		}
		c.Write([]byte{5, 0, 0, 1, 127, 0, 0, 1, byte(port >> 8), byte(port)})
		<-closeCtrl
		return nil
	})
	c := dialUDP(t, &socks5.Dialer{Endpoint: socks5.Endpoint{Address: addr}}, "192.0.2.1:53")
	c.SetReadDeadline(time.Now().Add(ioTimeout))
	close(closeCtrl)
	if _, err := c.Read(make([]byte, 64)); !errors.Is(err, socks5.ErrAssociationEnded) {
		t.Errorf("Read = %v, want ErrAssociationEnded", err)
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, socks5.ErrAssociationEnded) {
		t.Errorf("Write = %v, want ErrAssociationEnded", err)
	}
}

// dialUDP opens a UDP association through the dialer to addr, closed when
// the test ends.
func dialUDP(t *testing.T, d *socks5.Dialer, addr string) net.Conn {
	t.Helper()
	c, err := d.DialContext(t.Context(), "udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
