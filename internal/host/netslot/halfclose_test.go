package netslot_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/socks5/socks5test"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

// closeWriter is a connection that can half-close.
type closeWriter interface {
	net.Conn
	CloseWrite() error
}

// serveAfterEOF answers each connection on l as an HTTP/1.0 server does:
// it reads the request to its end, then writes the answer and closes.
func serveAfterEOF(l net.Listener) {
	serve(l, func(c net.Conn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		req, err := io.ReadAll(c)
		if err == nil {
			io.WriteString(c, "answer to "+string(req))
		}
	})
}

// serveFirst writes a greeting on each connection on l and half-closes,
// then reads to the end and sends what it read on got.
func serveFirst(l net.Listener, got chan<- string) {
	serve(l, func(c net.Conn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "greeting")
		c.(closeWriter).CloseWrite()
		b, err := io.ReadAll(c)
		if err != nil {
			b = []byte(err.Error())
		}
		got <- string(b)
	})
}

// egressPolicy forwards the test host's IPv4 range through a SOCKS5 Egress
// at addr.
func egressPolicy(addr string, tls *ctrlv1.EgressTls) *hostv1.NetworkAssignment {
	n := policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0)
	n.Policy.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: "eg", Destinations: []string{"198.51.100.0/24"}}}
	n.Egresses = []*hostv1.EgressAssignment{{EgressId: "eg", Revision: 1, Spec: &ctrlv1.EgressSpec{
		Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: addr, Tls: tls}}}}}
	return n
}

// TestSlotHalfClose checks on every path that a half-close passes through
// the slot both ways: the guest's, after which the answer still arrives,
// and the destination's, after which the guest can still send.
func TestSlotHalfClose(t *testing.T) {
	inet := nettest.NewInternet(t)
	answering := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	go serveAfterEOF(answering)
	greeting := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	got := make(chan string, 1)
	go serveFirst(greeting, got)
	port := func(l net.Listener) uint16 { return uint16(l.Addr().(*net.TCPAddr).Port) }

	plain := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{})
	serverTLS, ca := testtls.New(t, "127.0.0.1")
	overTLS := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{TLS: serverTLS})
	for _, path := range []struct {
		name    string
		network *hostv1.NetworkAssignment
	}{
		{"direct", policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0)},
		{"egress", egressPolicy(plain.Addr(), nil)},
		{"egress over TLS", egressPolicy(overTLS.Addr(), &ctrlv1.EgressTls{CaCert: ca})},
	} {
		t.Run(path.name, func(t *testing.T) {
			s := newSlot(t)
			s.Apply(path.network)
			t.Run("guest half-closes", func(t *testing.T) {
				c := dialGuest(t, s, netip.AddrPortFrom(nettest.HostIPv4, port(answering)))
				io.WriteString(c, "GET")
				if err := c.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(c)
				if err != nil || string(b) != "answer to GET" {
					t.Fatalf("after the guest's half-close: %q, %v; want the answer and EOF", b, err)
				}
			})
			t.Run("destination half-closes", func(t *testing.T) {
				c := dialGuest(t, s, netip.AddrPortFrom(nettest.HostIPv4, port(greeting)))
				b, err := io.ReadAll(c)
				if err != nil || string(b) != "greeting" {
					t.Fatalf("before the destination's half-close: %q, %v; want the greeting and EOF", b, err)
				}
				io.WriteString(c, "still sending")
				c.CloseWrite()
				if g := <-got; g != "still sending" {
					t.Fatalf("the destination read %q after its half-close, want what the guest sent", g)
				}
			})
		})
	}
}

// TestSlotPassesResetsOn: a connection that one side resets is reset on
// the other side too, not ended: a stream cut short must not read as
// complete (an HTTP/1.0 body, an upload that ends at the close).
func TestSlotPassesResetsOn(t *testing.T) {
	inet := nettest.NewInternet(t)
	resetting := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	go serve(resetting, func(c net.Conn) {
		io.WriteString(c, "partial answer")
		time.Sleep(200 * time.Millisecond) // the answer's bytes reach the guest first
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	reading := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	got := make(chan error, 1)
	go serve(reading, func(c net.Conn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadAll(c)
		got <- err
	})
	s := newSlot(t)
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))

	c := dialGuest(t, s, netip.AddrPortFrom(nettest.HostIPv4, uint16(resetting.Addr().(*net.TCPAddr).Port)))
	b, err := io.ReadAll(c)
	if string(b) != "partial answer" || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the guest read %q, %v from a destination that reset; want the answer, then ECONNRESET", b, err)
	}

	c = dialGuest(t, s, netip.AddrPortFrom(nettest.HostIPv4, uint16(reading.Addr().(*net.TCPAddr).Port)))
	io.WriteString(c, "partial upload")
	time.Sleep(200 * time.Millisecond) // the upload's bytes reach the destination first
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
	if err := <-got; !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the destination of a guest that reset read to %v, want ECONNRESET", err)
	}
}

// dialGuest connects from inside the slot.
func dialGuest(t *testing.T, s *netslot.Slot, dst netip.AddrPort) closeWriter {
	t.Helper()
	c, err := dial(t, s, dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c.(closeWriter)
}

// TestSlotEgressUpdateWhileDialing: an update of an Egress that comes
// while a connection is still being dialed through its old revision
// treats that connection as Apply treats the open ones: without a drain
// it is reset, with one it drains and then closes.
func TestSlotEgressUpdateWhileDialing(t *testing.T) {
	dst := echoOnTestHost(t)
	for _, drain := range []uint32{0, 1} {
		hold := make(chan struct{})
		proxy := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{HoldConnect: hold})
		s := newSlot(t)
		s.Apply(egressPolicy(proxy.Addr(), nil))
		result := make(chan error, 1)
		go func() {
			c, err := dial(t, s, dst)
			if err == nil {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				var b [1]byte
				if _, err = io.WriteString(c, "x"); err == nil {
					_, err = io.ReadFull(c, b[:])
				}
				if err == nil && drain > 0 {
					// Open through the drain: it ends with it.
					_, err = io.ReadFull(c, b[:])
					if err != nil {
						err = nil // closed at the drain's end
					} else {
						err = errors.New("the connection outlived its drain")
					}
				}
			}
			result <- err
		}()
		for len(proxy.Connects()) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		updated := egressPolicy(proxy.Addr(), nil)
		updated.Egresses[0].Revision, updated.Egresses[0].DrainSeconds = 2, drain
		s.Apply(updated)
		close(hold)
		err := <-result
		switch {
		case drain == 0 && err == nil:
			t.Error("a connection dialed through revision 1 went on after an update without drain")
		case drain > 0 && err != nil:
			t.Errorf("a connection dialed through revision 1 during an update with a drain: %v", err)
		}
	}
}
