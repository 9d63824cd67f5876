package netslot_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/host/netpolicy"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// serve runs handle on each connection l accepts, until l closes.
func serve(l net.Listener, handle func(c net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go handle(c)
	}
}

// echo serves lines back on l until it closes.
func echo(l net.Listener) {
	serve(l, func(c net.Conn) {
		defer c.Close()
		io.Copy(c, c)
	})
}

// echoOnTestHost starts an echo server on the test host's IPv4 address in
// a fresh test internet and returns its address.
func echoOnTestHost(t *testing.T) netip.AddrPort {
	t.Helper()
	inet := nettest.NewInternet(t)
	l := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	go echo(l)
	return netip.AddrPortFrom(nettest.HostIPv4, uint16(l.Addr().(*net.TCPAddr).Port))
}

func newSlot(t *testing.T, resolvers ...netip.AddrPort) *netslot.Slot {
	t.Helper()
	return newSlotWith(t, netslot.Config{DeploymentResolvers: resolvers})
}

// newSlotWith creates a slot of cfg with a namespace of the test's, the
// test internet's hard deny and a Changed that never blocks.
func newSlotWith(t *testing.T, cfg netslot.Config) *netslot.Slot {
	t.Helper()
	hosttest.RequireRoot(t)
	changed := make(chan struct{}, 100)
	cfg.Path = filepath.Join(t.TempDir(), "slot")
	cfg.HardDeny = netpolicy.HardDeny{Exempt: nettest.ExemptRanges, Platform: []netip.Prefix{netip.PrefixFrom(nettest.UplinkIPv4, 32), netip.PrefixFrom(nettest.UplinkIPv6, 128)}}
	cfg.Changed = func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	s, err := netslot.Create(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Destroy(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(s.Path()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace file left: %v", err)
		}
	})
	return s
}

func policy(rev uint64, mode ctrlv1.NetworkPolicyMode, drain uint32) *hostv1.NetworkAssignment {
	return &hostv1.NetworkAssignment{Policy: &ctrlv1.NetworkPolicy{Mode: mode, Revision: rev}, DrainSeconds: drain}
}

// roundTrip sends a line through c and expects it back.
func roundTrip(c net.Conn, line string) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return errors.New("echo mismatch: " + got)
	}
	return nil
}

// carried fails the test unless a connection from s's guest to dst
// carries line there and back.
func carried(t *testing.T, s *netslot.Slot, dst netip.AddrPort, line string) {
	t.Helper()
	c, err := dial(t, s, dst)
	if err != nil {
		t.Fatalf("to %s: %v", dst, err)
	}
	defer c.Close()
	if err := roundTrip(c, line); err != nil {
		t.Fatal(err)
	}
}

func dial(t *testing.T, s *netslot.Slot, addr netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return nettest.Dial(ctx, s.Path(), "tcp", addr.String())
}

func TestSlotDecidesEachConnection(t *testing.T) {
	inet := nettest.NewInternet(t)
	l4 := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	l6 := inet.Listen(t, "tcp6", "["+nettest.HostIPv6.String()+"]:0")
	go echo(l4)
	go echo(l6)
	dst4 := netip.AddrPortFrom(nettest.HostIPv4, uint16(l4.Addr().(*net.TCPAddr).Port))
	dst6 := netip.AddrPortFrom(nettest.HostIPv6, uint16(l6.Addr().(*net.TCPAddr).Port))
	s := newSlot(t)

	if _, err := dial(t, s, dst4); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("before any policy: %v, want connection refused", err)
	}
	if r := s.Report(); r.Status != nil {
		t.Fatalf("status before the first application: %v", r.Status)
	}
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 600))
	if _, err := dial(t, s, dst4); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("DENY_ALL: %v, want connection refused", err)
	}
	if got := s.Report().GetStatus().GetAppliedRevision(); got != 1 {
		t.Fatalf("applied revision %d, want 1", got)
	}

	s.Apply(policy(2, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 600))
	for _, dst := range []netip.AddrPort{dst4, dst6} {
		carried(t, s, dst, "hello "+dst.String())
	}
	// The host's own address and the slot's gateway are platform ranges.
	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(nettest.UplinkIPv4, dst4.Port()),
		netip.AddrPortFrom(netip.MustParseAddr("10.211.0.1"), 22),
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 22),
	} {
		if _, err := dial(t, s, dst); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("PUBLIC_INTERNET to %s: %v, want connection refused", dst, err)
		}
	}
}

func TestSlotHostAddressesChange(t *testing.T) {
	dst := echoOnTestHost(t)
	s := newSlot(t)
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	c, err := dial(t, s, dst)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.SetHostAddresses([]netip.Prefix{netip.PrefixFrom(nettest.HostIPv4, 32)})
	if _, err := dial(t, s, dst); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("an address the host gained: %v, want connection refused", err)
	}
}

// An address of the host that the slot's list does not hold (the host
// agent hears of a new one through netlink a moment after it appears) is
// refused all the same, TCP and echo alike: the kernel is asked at each
// dial. The test host beside it is still carried.
func TestSlotRefusesUnlistedHostAddress(t *testing.T) {
	reachable := echoOnTestHost(t)
	var accepted atomic.Int32
	var hostSide []netip.AddrPort
	for _, a := range []netip.Addr{nettest.UplinkIPv4, nettest.UplinkIPv6} {
		l, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		hostSide = append(hostSide, l.Addr().(*net.TCPAddr).AddrPort())
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
	}
	s := newSlot(t)
	s.SetHostAddresses(nil)
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	for _, dst := range hostSide {
		if _, err := dial(t, s, dst); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("to the host's %s: %v, want connection refused", dst, err)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host accepted %d connections from the guest", n)
	}
	if got := pingFrom(t, s, nettest.UplinkIPv4); got != nil {
		t.Errorf("echo to the host's %s answered with %v", nettest.UplinkIPv4, got)
	}
	carried(t, s, reachable, "still carried")
}

func TestSlotDrainsMovedConnections(t *testing.T) {
	dst := echoOnTestHost(t)
	s := newSlot(t)
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 600))
	c, err := dial(t, s, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	const drain = 2
	start := time.Now()
	s.Apply(policy(2, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, drain))
	if _, err := dial(t, s, dst); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a new connection after the change: %v, want refused", err)
	}
	if err := roundTrip(c, "still draining"); err != nil {
		t.Fatalf("the moved connection during its drain: %v", err)
	}
	st := s.Report().GetStatus()
	if st.GetAppliedRevision() != 2 || st.GetDrainingRevision() != 1 {
		t.Fatalf("status %v, want applied 2 draining 1", st)
	}
	c.SetReadDeadline(time.Now().Add(2 * drain * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the moved connection after its drain: %v, want it reset (cut, not ended)", err)
	}
	if took := time.Since(start); took < drain*time.Second {
		t.Fatalf("closed after %s, before the %ds drain", took, drain)
	}
	if got := s.Report().GetStatus().GetDrainingRevision(); got != 0 {
		t.Fatalf("draining revision %d after the drain, want 0", got)
	}
}

func TestSlotDNSUnderDenyAllFailsAtOnce(t *testing.T) {
	for _, c := range []struct {
		resolver, conf, dial string
	}{
		{"127.0.0.1:53", "nameserver 10.211.0.1\n", "10.211.0.1:53"},
		{"[2001:db8::53]:53", "nameserver fe80::1%eth0\n", "[fe80::1%eth0]:53"},
	} {
		t.Run(c.resolver, func(t *testing.T) {
			resolvers := []netip.AddrPort{netip.MustParseAddrPort(c.resolver)}
			if got := string(netslot.ResolvConf(resolvers)); got != c.conf {
				t.Fatalf("resolv.conf %q, want %q", got, c.conf)
			}
			dnsRefused(t, newSlot(t, resolvers...), c.dial)
		})
	}
}

// dnsRefused checks that a query to addr in the slot is answered REFUSED.
func dnsRefused(t *testing.T, s *netslot.Slot, addr string) {
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 600))
	if resp := askUDP(t, s, addr); resp.Rcode != dns.RcodeRefused {
		t.Fatalf("answer %v, want REFUSED for the query", resp)
	}
}

// pingFrom sends one echo request from inside the slot and returns the
// type of the ICMP message that answers it, or nil when none arrives.
func pingFrom(t *testing.T, s *netslot.Slot, dst netip.Addr) icmp.Type {
	t.Helper()
	network, proto := "ip4:icmp", 1
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if dst.Is6() {
		network, proto, typ = "ip6:ipv6-icmp", 58, ipv6.ICMPTypeEchoRequest
	}
	var c *icmp.PacketConn
	if err := netnsfile.Do(s.Path(), func() (err error) {
		c, err = icmp.ListenPacket(network, "")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: 77, Seq: 1, Data: []byte("kibotos")}}).Marshal(nil)
	if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return nil
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type == typ {
			continue // our own request, seen by a raw socket
		}
		if e, ok := m.Body.(*icmp.Echo); ok && (e.ID != 77 || string(e.Data) != "kibotos") {
			continue
		}
		return m.Type
	}
}

func TestSlotICMPEcho(t *testing.T) {
	nettest.NewInternet(t)
	s := newSlot(t)
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 0))
	for _, dst := range []netip.Addr{nettest.HostIPv4, nettest.HostIPv6, netip.MustParseAddr("203.0.113.9")} {
		if got := pingFrom(t, s, dst); got != nil {
			t.Errorf("DENY_ALL: echo to %s answered with %v", dst, got)
		}
	}
	s.Apply(policy(2, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	if got := pingFrom(t, s, nettest.HostIPv4); got != ipv4.ICMPTypeEchoReply {
		t.Errorf("PUBLIC_INTERNET IPv4 echo: %v, want a reply", got)
	}
	if got := pingFrom(t, s, nettest.HostIPv6); got != ipv6.ICMPTypeEchoReply {
		t.Errorf("PUBLIC_INTERNET IPv6 echo: %v, want a reply", got)
	}
	for _, dst := range []netip.Addr{nettest.UplinkIPv4, netip.MustParseAddr("10.211.0.1")} {
		if got := pingFrom(t, s, dst); got != nil {
			t.Errorf("echo to the hard-denied %s answered with %v", dst, got)
		}
	}
	n := policy(3, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0)
	n.Policy.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: "eg", Destinations: []string{"198.51.100.0/24", "2001:db8:5100::/64"}}}
	n.Egresses = []*hostv1.EgressAssignment{{EgressId: "eg", Revision: 1, Spec: &ctrlv1.EgressSpec{
		Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:1"}}}}}
	s.Apply(n)
	if got := pingFrom(t, s, nettest.HostIPv4); got != ipv4.ICMPTypeDestinationUnreachable {
		t.Errorf("IPv4 echo to an Egress destination: %v, want destination unreachable", got)
	}
	if got := pingFrom(t, s, nettest.HostIPv6); got != ipv6.ICMPTypeDestinationUnreachable {
		t.Errorf("IPv6 echo to an Egress destination: %v, want destination unreachable", got)
	}
}

// TestSlotPortReuseAfterDestinationCloses dials from one fixed guest port
// again and again to a destination that closes first: the slot's side of
// each closed connection must not keep the next one from being accepted.
// The slot's TIME_WAIT lasts no time, so the next SYN meets the old
// endpoint only when it comes within microseconds; with a minute of it,
// every SYN does.
func TestSlotPortReuseAfterDestinationCloses(t *testing.T) {
	for _, tc := range []struct {
		host     netip.Addr
		timeWait time.Duration
	}{{nettest.HostIPv4, 0}, {nettest.HostIPv4, time.Minute}, {nettest.HostIPv6, time.Minute}} {
		t.Run(fmt.Sprintf("%s/%s", tc.host, tc.timeWait), func(t *testing.T) {
			inet := nettest.NewInternet(t)
			l := inet.Listen(t, "tcp", netip.AddrPortFrom(tc.host, 0).String())
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Write([]byte("bye\n"))
					c.Close()
				}
			}()
			s := newSlot(t)
			if tc.timeWait != 0 {
				netslot.SetTimeWait(s, tc.timeWait)
			}
			s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
			dst := netip.AddrPortFrom(tc.host, uint16(l.Addr().(*net.TCPAddr).Port))
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				var c net.Conn
				err := netnsfile.Do(s.Path(), func() (err error) {
					d := net.Dialer{LocalAddr: &net.TCPAddr{Port: 40123}, Control: func(_, _ string, rc syscall.RawConn) error {
						return rc.Control(func(fd uintptr) {
							syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
						})
					}}
					// The guest's own side of the last connection may still be
					// waiting for its final ACK for a moment.
					for range 40 {
						if c, err = d.DialContext(ctx, "tcp", dst.String()); !errors.Is(err, syscall.EADDRNOTAVAIL) {
							return err
						}
						time.Sleep(50 * time.Millisecond)
					}
					return err
				})
				cancel()
				if err != nil {
					t.Fatalf("connection %d from the reused port: %v", i+1, err)
				}
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if b, err := io.ReadAll(c); err != nil || string(b) != "bye\n" {
					t.Fatalf("connection %d: %q, %v", i+1, b, err)
				}
				c.Close()
			}
		})
	}
}

// TestSlotBoundsFlows: the slot carries at most MaxFlows of the guest's
// connections at once, or as many as the host's socket budget has left;
// one more is reset and counted, and a connection that ends makes room
// for the next.
func TestSlotBoundsFlows(t *testing.T) {
	dst := echoOnTestHost(t)
	for name, cfg := range map[string]netslot.Config{
		"MaxFlows": {MaxFlows: 3},
		"budget":   {Sockets: netslot.NewSocketBudget(3)},
	} {
		t.Run(name, func(t *testing.T) {
			counters := new(netslot.Counters)
			cfg.Counters = counters
			s := newSlotWith(t, cfg)
			s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 600))
			var open []net.Conn
			for i := range 3 {
				c, err := dial(t, s, dst)
				if err != nil {
					t.Fatalf("connection %d: %v", i+1, err)
				}
				defer c.Close()
				if err := roundTrip(c, "hello"); err != nil {
					t.Fatalf("connection %d: %v", i+1, err)
				}
				open = append(open, c)
			}
			if _, err := dial(t, s, dst); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("a fourth connection: %v, want connection refused", err)
			}
			if n := counters.Limited.Load(); n != 1 {
				t.Errorf("Limited = %d, want 1", n)
			}
			open[0].Close()
			// The slot sees the close once the guest's FIN crosses the link.
			deadline := time.Now().Add(5 * time.Second)
			for {
				c, err := dial(t, s, dst)
				if err == nil {
					defer c.Close()
					if err := roundTrip(c, "again"); err != nil {
						t.Fatal(err)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after a connection closed: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// TestSlotLogsWhyItRefused: at debug level, each refused connection is
// logged with its destination and the policy's reason, under the slot's
// namespace (the execution): the counters say how many, the log which.
func TestSlotLogsWhyItRefused(t *testing.T) {
	logged := new(testutil.SyncBuffer) // the slot's goroutines write it
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	dst := echoOnTestHost(t)
	s := newSlot(t)
	n := policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0)
	n.Policy.Deny = []string{dst.Addr().String() + "/32"}
	s.Apply(n)
	if c, err := dial(t, s, dst); err == nil {
		c.Close()
		t.Fatal("a denied destination was reached")
	}
	for _, want := range []string{"guest connection refused", "dst=" + dst.String(), "deny entry " + dst.Addr().String() + "/32", "netns=" + s.Path()} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logged.String())
		}
	}
}
