package socks5test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testutil"
)

// These tests speak raw RFC 1928 bytes, so the server is checked apart from
// the client it serves in the socks5 tests.

func exchange(t *testing.T, c net.Conn, send, want []byte) {
	t.Helper()
	if _, err := c.Write(send); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("sent % x, got % x, want % x", send, got, want)
	}
}

func dial(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", s.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

func TestConnectWire(t *testing.T) {
	target := testutil.ServeOnce(t, func(c net.Conn) { io.Copy(c, c) }).AddrPort()

	s := Start(t, "127.0.0.1:0", Options{Username: "u", Password: "p"})
	c := dial(t, s)
	exchange(t, c, []byte{5, 1, 2}, []byte{5, 2})
	exchange(t, c, []byte{1, 1, 'u', 1, 'p'}, []byte{1, 0})
	req := binary.BigEndian.AppendUint16([]byte{5, 1, 0, 1, 127, 0, 0, 1}, target.Port())
	exchange(t, c, req, []byte{5, 0, 0, 1, 127, 0, 0, 1})
	io.ReadFull(c, make([]byte, 2)) // BND.PORT
	exchange(t, c, []byte("echo"), []byte("echo"))
	if got, want := s.Connects(), []string{target.String()}; !slices.Equal(got, want) {
		t.Errorf("Connects() = %q, want %q", got, want)
	}
	if n := s.Accepted(); n != 1 {
		t.Errorf("Accepted() = %d, want 1", n)
	}
}

func TestUDPWire(t *testing.T) {
	echo, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := echo.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			echo.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	target := echo.LocalAddr().(*net.UDPAddr).AddrPort()

	s := Start(t, "127.0.0.1:0", Options{UDP: true})
	c := dial(t, s)
	exchange(t, c, []byte{5, 1, 0}, []byte{5, 0})
	exchange(t, c, []byte{5, 3, 0, 1, 0, 0, 0, 0, 0, 0}, []byte{5, 0, 0, 1, 127, 0, 0, 1})
	var p [2]byte
	io.ReadFull(c, p[:])
	relay := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), binary.BigEndian.Uint16(p[:]))

	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(5 * time.Second))
	header := binary.BigEndian.AppendUint16([]byte{0, 0, 0, 1, 127, 0, 0, 1}, target.Port())
	if _, err := u.WriteToUDPAddrPort(append(header, "dgram"...), relay); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	n, err := u.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(header, "dgram"...); !bytes.Equal(buf[:n], want) {
		t.Errorf("got % x, want % x", buf[:n], want)
	}
	if n := s.UDPDatagrams(); n != 1 {
		t.Errorf("UDPDatagrams() = %d, want 1", n)
	}
}
