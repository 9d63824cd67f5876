package netslot_test

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"github.com/miekg/dns"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/socks5/socks5test"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// counts is what Counters held at one moment.
type counts struct {
	direct, egress, dns, refused, unreachable uint64
	handshakeFaults, resolverFaults           uint64
}

func read(c *netslot.Counters) counts {
	var resolver uint64
	for n := range ctrlv1.ResolverObservationKind_name {
		resolver += c.ResolverFaults.Load(ctrlv1.ResolverObservationKind(n))
	}
	return counts{direct: c.Direct.Load(), egress: c.Egress.Load(), dns: c.DNS.Load(), refused: c.Refused.Load(),
		unreachable: c.Unreachable.Load(), resolverFaults: resolver,
		handshakeFaults: c.EgressFaults.Load(ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_HANDSHAKE_FAILED)}
}

// TestSlotCounters checks that two slots sharing Counters count each
// connection once by what became of it: refused by the policy, carried
// directly, through an Egress or to the link DNS address, or reset because
// its outbound leg failed; and each Egress and Resolver fault by kind.
func TestSlotCounters(t *testing.T) {
	inet := nettest.NewInternet(t)
	l := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	go echo(l)
	open := netip.AddrPortFrom(nettest.HostIPv4, uint16(l.Addr().(*net.TCPAddr).Port))
	gone := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	closed := netip.AddrPortFrom(nettest.HostIPv4, uint16(gone.Addr().(*net.TCPAddr).Port))
	gone.Close()
	silent := inet.ListenPacket(t, "udp4", nettest.HostIPv4.String()+":0") // answers no query
	proxy := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{})

	c := new(netslot.Counters)
	s := newSlotWith(t, netslot.Config{Counters: c})
	other := newSlotWith(t, netslot.Config{Counters: c})
	want := counts{}
	check := func(step string) {
		t.Helper()
		if got := read(c); got != want {
			t.Fatalf("%s: counters %+v, want %+v", step, got, want)
		}
	}
	refused := func(s *netslot.Slot, dst netip.AddrPort) {
		t.Helper()
		if _, err := dial(t, s, dst); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("to %s: %v, want connection refused", dst, err)
		}
	}

	refused(s, open) // no policy yet
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 0))
	refused(s, open)
	refused(other, open)
	want.refused = 3
	check("refused")

	s.Apply(policy(2, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	carried(t, s, open, "counted")
	refused(s, closed)
	want.direct, want.unreachable = 1, 1
	check("direct")

	s.Apply(egressPolicy(proxy.Addr(), nil))
	carried(t, s, open, "counted")
	want.egress = 1
	check("through the Egress")
	proxy.SetFault(socks5test.Garbage)
	refused(s, open)
	want.unreachable, want.handshakeFaults = 2, 1
	check("through a broken Egress")

	s.Apply(resolverPolicy(1, 0, silent.LocalAddr().String()))
	q := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
	conn := dnsStream(t, s)
	if err := conn.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	if r, err := conn.ReadMsg(); err != nil || r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("a query to a silent Resolver: %v, %v; want SERVFAIL", r, err)
	}
	want.dns, want.resolverFaults = 1, 1
	check("a silent Resolver")
}
