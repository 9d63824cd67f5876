package socks5_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/host/socks5"
	"github.com/kibotos/kibotos/internal/host/socks5/socks5test"
)

// The credentials every authenticating test uses; the password must never
// show in an error.
const (
	user     = "alice"
	password = "pw-3c9f1e7a-must-not-leak"
)

// ioTimeout bounds every read and write of a test.
const ioTimeout = 5 * time.Second

// echoTCP serves TCP on addr, echoing what it reads, until the test ends.
func echoTCP(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(ioTimeout))
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// echoUDP serves UDP on addr, echoing every datagram, until the test ends.
func echoUDP(t *testing.T, addr string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	return pc.LocalAddr().String()
}

// requireIPv6 skips the test when ::1 cannot be listened on.
func requireIPv6(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ln.Close()
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// roundTrip sends msg on a stream and expects it back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(got) != msg {
		t.Fatalf("echo = %q, want %q", got, msg)
	}
}

// datagramTrip sends msg as one datagram and expects it back as one.
func datagramTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(ioTimeout))
	if n, err := c.Write([]byte(msg)); err != nil || n != len(msg) {
		t.Fatalf("write = %d, %v", n, err)
	}
	buf := make([]byte, 1<<16)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(buf[:n]) != msg {
		t.Fatalf("echo = %q, want %q", buf[:n], msg)
	}
}

// wantKind fails the test unless err is an *socks5.Error of kind, whose
// EgressFault matches it and whose text holds no password.
func wantKind(t *testing.T, err error, kind socks5.Kind) *socks5.Error {
	t.Helper()
	var e *socks5.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v, want an *socks5.Error of kind %v", err, kind)
	}
	if e.Kind != kind {
		t.Fatalf("kind = %v (%v), want %v", e.Kind, err, kind)
	}
	if want := kind != socks5.DestinationFailed; e.EgressFault() != want {
		t.Errorf("EgressFault() = %v, want %v", e.EgressFault(), want)
	}
	noPassword(t, err)
	return e
}

// wantPlain fails the test unless err is an error that is not an
// *socks5.Error.
func wantPlain(t *testing.T, err error) {
	t.Helper()
	var e *socks5.Error
	if err == nil || errors.As(err, &e) {
		t.Fatalf("err = %v, want an error that is not an *socks5.Error", err)
	}
	noPassword(t, err)
}

func noPassword(t *testing.T, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), password) {
		t.Errorf("the error text holds the password: %v", err)
	}
}

// dialer returns a dialer of srv with the test credentials.
func dialer(srv *socks5test.Server) *socks5.Dialer {
	return &socks5.Dialer{
		Endpoint:         socks5.Endpoint{Address: srv.Addr(), Username: user, Password: password},
		HandshakeTimeout: 2 * time.Second,
	}
}

// checkRecorder is a dial check that records every address and refuses
// those refuse reports.
type checkRecorder struct {
	mu      sync.Mutex
	checked []netip.Addr
	refuse  func(netip.Addr) bool
}

var errRefused = errors.New("in a special-purpose range")

func (c *checkRecorder) check(a netip.Addr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checked = append(c.checked, a)
	if c.refuse != nil && c.refuse(a) {
		return errRefused
	}
	return nil
}

func (c *checkRecorder) addrs() []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]netip.Addr(nil), c.checked...)
}

// rawEndpoint accepts one TCP connection on loopback and hands it to serve,
// for tests that need bytes no well-behaved server sends or that check the
// bytes the client sends. The test fails if serve reports an error.
func rawEndpoint(t *testing.T, serve func(c net.Conn) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(ioTimeout))
		done <- serve(c)
	}()
	t.Cleanup(func() {
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("raw endpoint: %v", err)
		}
	})
	return ln.Addr().String()
}

// expect reads len(want) bytes from r and compares them with want.
func expect(r io.Reader, what string, want []byte) error {
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		return fmt.Errorf("%s: %v", what, err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%s: got % x, want % x", what, got, want)
	}
	return nil
}
