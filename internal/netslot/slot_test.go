package netslot_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/netpolicy"
	"github.com/kibotos/kibotos/internal/netslot"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// echo serves lines back on l until it closes.
func echo(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}

func newSlot(t *testing.T, resolvers ...netip.AddrPort) *netslot.Slot {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	changed := make(chan struct{}, 100)
	s, err := netslot.Create(netslot.Config{
		Path:                filepath.Join(t.TempDir(), "slot"),
		HardDeny:            netpolicy.HardDeny{Exempt: nettest.ExemptRanges, Platform: []netip.Prefix{netip.PrefixFrom(nettest.UplinkIPv4, 32), netip.PrefixFrom(nettest.UplinkIPv6, 128)}},
		DeploymentResolvers: resolvers,
		Changed: func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	})
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
		c, err := dial(t, s, dst)
		if err != nil {
			t.Fatalf("PUBLIC_INTERNET to %s: %v", dst, err)
		}
		if err := roundTrip(c, "hello "+dst.String()); err != nil {
			t.Fatal(err)
		}
		c.Close()
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

func TestSlotDrainsMovedConnections(t *testing.T) {
	inet := nettest.NewInternet(t)
	l := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	go echo(l)
	dst := netip.AddrPortFrom(nettest.HostIPv4, uint16(l.Addr().(*net.TCPAddr).Port))
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
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read data after the drain")
	}
	if took := time.Since(start); took < drain*time.Second {
		t.Fatalf("closed after %s, before the %ds drain", took, drain)
	}
	if got := s.Report().GetStatus().GetDrainingRevision(); got != 0 {
		t.Fatalf("draining revision %d after the drain, want 0", got)
	}
}

func TestSlotDNSUnderDenyAllFailsAtOnce(t *testing.T) {
	s := newSlot(t, netip.MustParseAddrPort("127.0.0.1:53"))
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 600))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := nettest.Dial(ctx, s.Path(), "udp", "10.211.0.1:53")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion("example.com.", dns.TypeA)
	resp, _, err := (&dns.Client{Timeout: 2 * time.Second}).ExchangeWithConnContext(ctx, q, &dns.Conn{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Rcode != dns.RcodeRefused || resp.Id != q.Id {
		t.Fatalf("answer %v, want REFUSED for the query", resp)
	}
}
