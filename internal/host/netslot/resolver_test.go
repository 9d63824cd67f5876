package netslot_test

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/socks5/socks5test"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// answeringResolver serves DNS over UDP on the test host, answering every
// A query with addr; it returns its address.
func answeringResolver(t *testing.T, inet *nettest.Internet, addr string) string {
	return countingResolver(t, inet, addr, new(atomic.Int32)).String()
}

// resolverPolicy resolves through Resolver "r" at revision rev, whose
// update had the given drain, at the UDP upstream address.
func resolverPolicy(rev uint64, drain uint32, address string) *hostv1.NetworkAssignment {
	n := policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 600)
	n.Policy.Resolvers = []*ctrlv1.NetworkPolicyResolver{{ResolverId: "r",
		Path: &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_Direct{Direct: &ctrlv1.ResolverDirectPath{}}}}}
	n.Resolvers = []*hostv1.ResolverAssignment{{ResolverId: "r", Revision: rev, DrainSeconds: drain,
		Spec: &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: address}}}}}
	return n
}

// dnsStream opens a guest's DNS-over-TCP connection to the link DNS
// address.
func dnsStream(t *testing.T, s *netslot.Slot) *dns.Conn {
	t.Helper()
	return dnsStreamTo(t, s, linkDNS)
}

// dnsStreamTo opens a DNS-over-TCP connection from s's guest to addr.
func dnsStreamTo(t *testing.T, s *netslot.Slot, addr string) *dns.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := nettest.Dial(ctx, s.Path(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return &dns.Conn{Conn: c}
}

// lookup asks c for example.com's A record and returns the address in the
// answer.
func lookup(c *dns.Conn) (string, error) {
	q := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
	if err := c.WriteMsg(q); err != nil {
		return "", err
	}
	r, err := c.ReadMsg()
	if err != nil {
		return "", err
	}
	if len(r.Answer) != 1 {
		return "", &net.AddrError{Err: "no single answer", Addr: r.String()}
	}
	return r.Answer[0].(*dns.A).A.String(), nil
}

func resolverStatus(s *netslot.Slot) *ctrlv1.NetworkPolicyResolverStatus {
	rs := s.Report().GetStatus().GetResolvers()
	if len(rs) != 1 {
		return nil
	}
	return rs[0]
}

// TestSlotResolverUpdateDrains checks that an update of the policy's
// Resolver leaves the guest's DNS connections on the replaced revision
// until the update's drain runs out, and that the status says so.
func TestSlotResolverUpdateDrains(t *testing.T) {
	inet := nettest.NewInternet(t)
	first := answeringResolver(t, inet, "192.0.2.1")
	second := answeringResolver(t, inet, "192.0.2.2")
	third := answeringResolver(t, inet, "192.0.2.3")
	s := newSlot(t, netip.MustParseAddrPort("127.0.0.1:53"))
	s.Apply(resolverPolicy(1, 0, first))
	old := dnsStream(t, s)
	if got, err := lookup(old); err != nil || got != "192.0.2.1" {
		t.Fatalf("revision 1: %s, %v", got, err)
	}

	s.Apply(resolverPolicy(2, 600, second))
	if got, err := lookup(dnsStream(t, s)); err != nil || got != "192.0.2.2" {
		t.Fatalf("a new connection after the update: %s, %v; want revision 2's answer", got, err)
	}
	if got, err := lookup(old); err != nil || got != "192.0.2.1" {
		t.Fatalf("the connection on revision 1 during its drain: %s, %v; want revision 1's answer", got, err)
	}
	if st := resolverStatus(s); st.GetAppliedRevision() != 2 || st.GetDrainingRevision() != 1 {
		t.Fatalf("resolver status %v, want applied 2 draining 1", st)
	}

	// With no drain, the connections on the replaced revision close at once;
	// an earlier update's deadline still holds for those it moved.
	onSecond := dnsStream(t, s)
	if got, err := lookup(onSecond); err != nil || got != "192.0.2.2" {
		t.Fatalf("revision 2: %s, %v", got, err)
	}
	s.Apply(resolverPolicy(3, 0, third))
	if _, err := onSecond.ReadMsg(); err == nil {
		t.Fatal("the connection on revision 2 stayed open after an update without drain")
	}
	if got, err := lookup(old); err != nil || got != "192.0.2.1" {
		t.Fatalf("the connection on revision 1 after a later update: %s, %v; want revision 1's answer", got, err)
	}
	if st := resolverStatus(s); st.GetAppliedRevision() != 3 || st.GetDrainingRevision() != 1 {
		t.Fatalf("resolver status %v, want applied 3 draining 1", st)
	}
	old.Close()
	if got, err := lookup(dnsStream(t, s)); err != nil || got != "192.0.2.3" {
		t.Fatalf("a new connection: %s, %v; want revision 3's answer", got, err)
	}
}

// TestSlotBoundsDNSStreams: a slot serves 16 of a guest's DNS-over-TCP
// connections at once, and resets a 17th, counted once, as limited, not
// as a DNS connection carried: each holds buffers in the host agent's
// memory, not the guest's.
func TestSlotBoundsDNSStreams(t *testing.T) {
	counters := new(netslot.Counters)
	s := newSlotWith(t, netslot.Config{DeploymentResolvers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}, Counters: counters})
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 600))
	for i := range 16 {
		if got, err := lookupRcode(dnsStream(t, s)); err != nil || got != dns.RcodeRefused {
			t.Fatalf("stream %d: %v, %v; want REFUSED", i+1, got, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := nettest.Dial(ctx, s.Path(), "tcp", "10.211.0.1:53"); err == nil {
		c.Close()
		t.Error("a 17th stream was accepted")
	}
	if n, carried := counters.Limited.Load(), counters.DNS.Load(); n != 1 || carried != 16 {
		t.Errorf("Limited = %d, DNS = %d; want 1 and 16", n, carried)
	}
}

// lookupRcode asks c one query, keeps c open, and returns the answer's code.
func lookupRcode(c *dns.Conn) (int, error) {
	if err := c.WriteMsg(new(dns.Msg).SetQuestion("example.com.", dns.TypeA)); err != nil {
		return 0, err
	}
	r, err := c.ReadMsg()
	if err != nil {
		return 0, err
	}
	return r.Rcode, nil
}

// TestSlotDrainingDNSStreamFollowsThePolicy: a DNS stream draining on a
// replaced Resolver revision forwards nothing more once the policy no
// longer names that Resolver: under DENY_ALL its queries are REFUSED (no
// packet leaves the slot), under another Resolver they go to that one,
// and the status shows no drain.
func TestSlotDrainingDNSStreamFollowsThePolicy(t *testing.T) {
	inet := nettest.NewInternet(t)
	first := answeringResolver(t, inet, "192.0.2.1")
	second := answeringResolver(t, inet, "192.0.2.2")
	other := answeringResolver(t, inet, "192.0.2.9")
	s := newSlot(t, netip.MustParseAddrPort("127.0.0.1:53"))
	s.Apply(resolverPolicy(1, 0, first))
	stream := dnsStream(t, s)
	if got, err := lookup(stream); err != nil || got != "192.0.2.1" {
		t.Fatalf("revision 1: %s, %v", got, err)
	}
	s.Apply(resolverPolicy(2, 600, second)) // the stream drains on revision 1

	denied := policy(2, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 600)
	s.Apply(denied)
	if got, err := lookupRcode(stream); err != nil || got != dns.RcodeRefused {
		t.Fatalf("the draining stream under DENY_ALL: %v, %v; want REFUSED", got, err)
	}
	if st := s.Report().GetStatus(); st.GetDrainingRevision() != 0 || len(st.GetResolvers()) != 0 {
		t.Errorf("status under DENY_ALL: %v, want nothing draining", st)
	}

	// Back on r, draining again, then a policy naming another Resolver.
	s.Apply(resolverPolicy(3, 0, first))
	s.Apply(resolverPolicy(4, 600, second))
	if got, err := lookup(stream); err != nil || got != "192.0.2.1" {
		t.Fatalf("the stream draining on revision 3: %s, %v", got, err)
	}
	another := resolverPolicy(1, 0, other)
	another.Policy.Revision = 3
	another.Policy.Resolvers[0].ResolverId, another.Resolvers[0].ResolverId = "r2", "r2"
	s.Apply(another)
	if got, err := lookup(stream); err != nil || got != "192.0.2.9" {
		t.Fatalf("the stream once the policy names another Resolver: %s, %v; want its answer", got, err)
	}
}

// TestSlotDeletedEgressClosesDrainingDNSStream: a DNS stream draining on a
// Resolver revision that went through an Egress closes when that Egress is
// deleted, as the connections draining through it do.
func TestSlotDeletedEgressClosesDrainingDNSStream(t *testing.T) {
	inet := nettest.NewInternet(t)
	tcpResolver := func(answer string) string {
		l := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
		srv := &dns.Server{Listener: l, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
			r := new(dns.Msg).SetReply(q)
			rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A " + answer)
			r.Answer = append(r.Answer, rr)
			w.WriteMsg(r)
		})}
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
		return l.Addr().String()
	}
	proxy := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{})
	through := func(rev uint64, address string) *hostv1.NetworkAssignment {
		n := egressPolicy(proxy.Addr(), nil)
		n.Policy.Resolvers = []*ctrlv1.NetworkPolicyResolver{{ResolverId: "r",
			Path: &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_EgressId{EgressId: "eg"}}}}
		n.Resolvers = []*hostv1.ResolverAssignment{{ResolverId: "r", Revision: rev, DrainSeconds: 600,
			Spec: &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: address}}}}}
		return n
	}
	s := newSlot(t, netip.MustParseAddrPort("127.0.0.1:53"))
	s.Apply(through(1, tcpResolver("192.0.2.1")))
	stream := dnsStream(t, s)
	if got, err := lookup(stream); err != nil || got != "192.0.2.1" {
		t.Fatalf("revision 1 through the Egress: %s, %v", got, err)
	}
	s.Apply(through(2, tcpResolver("192.0.2.2"))) // the stream drains on revision 1
	if got, err := lookup(stream); err != nil || got != "192.0.2.1" {
		t.Fatalf("the stream draining on revision 1: %s, %v", got, err)
	}
	s.CloseEgresses(map[string]bool{"eg": true})
	if _, err := lookup(stream); err == nil {
		t.Fatal("the stream draining through the deleted Egress still answers")
	}
}
