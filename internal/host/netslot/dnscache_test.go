package netslot_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// countingResolver serves DNS over UDP on the test host, answering every
// A query with addr (TTL 60) and counting the queries; it returns its
// address.
func countingResolver(t *testing.T, inet *nettest.Internet, addr string, queries *atomic.Int32) netip.AddrPort {
	pc := inet.ListenPacket(t, "udp4", nettest.HostIPv4.String()+":0")
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		queries.Add(1)
		r := new(dns.Msg).SetReply(q)
		rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A " + addr)
		r.Answer = append(r.Answer, rr)
		w.WriteMsg(r)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// askUDP queries addr, the slot's link DNS address, over UDP for
// example.com's A record and returns the answer.
func askUDP(t *testing.T, s *netslot.Slot, addr string) *dns.Msg {
	t.Helper()
	q := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
	r, err := exchangeUDP(t, s, addr, q, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Id != q.Id {
		t.Fatalf("answer %v to another query", r)
	}
	return r
}

// exchangeUDP sends q from s's guest to addr over UDP and returns the
// answer; udpSize, when not 0, is the largest answer the client reads.
func exchangeUDP(t *testing.T, s *netslot.Slot, addr string, q *dns.Msg, udpSize uint16) (*dns.Msg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := nettest.Dial(ctx, s.Path(), "udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, _, err := (&dns.Client{Timeout: 2 * time.Second, UDPSize: udpSize}).ExchangeWithConnContext(ctx, q, &dns.Conn{Conn: c, UDPSize: udpSize})
	return r, err
}

const linkDNS = "10.211.0.1:53"

// answered fails unless r answers with the one address want.
func answered(t *testing.T, r *dns.Msg, want string) {
	t.Helper()
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != want {
		t.Fatalf("answer %v, want %s", r, want)
	}
}

// TestSlotDNSCache answers repeated queries from the slot's cache and
// never serves a cached answer that the assignment in force would not
// give: a change of policy or Resolver, or of the host's addresses,
// starts from an empty cache.
func TestSlotDNSCache(t *testing.T) {
	inet := nettest.NewInternet(t)
	var deploymentQueries, resolverQueries atomic.Int32
	deployment := countingResolver(t, inet, "192.0.2.1", &deploymentQueries)
	counters := new(netslot.Counters)
	s := newSlotWith(t, netslot.Config{DeploymentResolvers: []netip.AddrPort{deployment}, Counters: counters})
	public := func(rev uint64) {
		s.Apply(policy(rev, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	}

	public(1)
	answered(t, askUDP(t, s, linkDNS), "192.0.2.1")
	answered(t, askUDP(t, s, linkDNS), "192.0.2.1")
	if n := deploymentQueries.Load(); n != 1 {
		t.Fatalf("the upstream received %d queries, want 1", n)
	}
	// Over TCP the cache answers too.
	if got, err := lookup(dnsStream(t, s)); err != nil || got != "192.0.2.1" {
		t.Fatalf("over TCP: %s, %v", got, err)
	}
	if c, f := counters.DNSCached.Load(), counters.DNSForwarded.Load(); c != 2 || f != 1 {
		t.Fatalf("counted %d cached and %d forwarded, want 2 and 1", c, f)
	}

	// DENY_ALL refuses what the cache holds.
	s.Apply(policy(2, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 0))
	if r := askUDP(t, s, linkDNS); r.Rcode != dns.RcodeRefused {
		t.Fatalf("under DENY_ALL: %v, want REFUSED", r)
	}
	if n := counters.DNSLocal.Load(); n != 1 {
		t.Fatalf("counted %d local answers, want 1", n)
	}
	// The same assignment again keeps the cache; a new one starts empty.
	public(3)
	answered(t, askUDP(t, s, linkDNS), "192.0.2.1")
	if n := deploymentQueries.Load(); n != 2 {
		t.Fatalf("after DENY_ALL and back the upstream received %d queries, want 2", n)
	}
	public(3)
	answered(t, askUDP(t, s, linkDNS), "192.0.2.1")
	if n := deploymentQueries.Load(); n != 2 {
		t.Fatalf("an equal assignment cleared the cache: %d queries upstream, want 2", n)
	}

	// A Resolver answers instead of the deployment resolver at once.
	resolver := countingResolver(t, inet, "192.0.2.2", &resolverQueries)
	s.Apply(resolverPolicy(1, 0, resolver.String()))
	answered(t, askUDP(t, s, linkDNS), "192.0.2.2")
	answered(t, askUDP(t, s, linkDNS), "192.0.2.2")
	if n := resolverQueries.Load(); n != 1 {
		t.Fatalf("the Resolver received %d queries, want 1", n)
	}

	// The Resolver's address becomes the host's own: the dial check
	// refuses it, and the cache no longer answers for it.
	s.SetHostAddresses([]netip.Prefix{netip.PrefixFrom(resolver.Addr(), 32)})
	if r := askUDP(t, s, linkDNS); r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("a Resolver the hard deny covers: %v, want SERVFAIL", r)
	}
	if n := resolverQueries.Load(); n != 1 {
		t.Fatalf("the hard-denied Resolver received a query (%d)", n)
	}
}

// TestSlotAnswersDNSAtBothLinkAddresses asks the link DNS address of
// each family, over UDP and TCP, whichever family the first deployment
// resolver has: a guest started when its host's first resolver had the
// other family keeps the other address in its resolv.conf, and must keep
// its DNS when the host restarts.
func TestSlotAnswersDNSAtBothLinkAddresses(t *testing.T) {
	inet := nettest.NewInternet(t)
	var queries atomic.Int32
	v4 := countingResolver(t, inet, "192.0.2.1", &queries)
	pc := inet.ListenPacket(t, "udp6", netip.AddrPortFrom(nettest.HostIPv6, 0).String())
	v6srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg).SetReply(q)
		rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A 192.0.2.6")
		r.Answer = append(r.Answer, rr)
		w.WriteMsg(r)
	})}
	go v6srv.ActivateAndServe()
	t.Cleanup(func() { v6srv.Shutdown() })
	v6 := netip.MustParseAddrPort(pc.LocalAddr().String())

	for _, c := range []struct {
		first netip.AddrPort
		want  string
	}{{v4, "192.0.2.1"}, {v6, "192.0.2.6"}} {
		s := newSlot(t, c.first)
		s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
		for _, addr := range []string{linkDNS, "[fe80::1%eth0]:53"} {
			answered(t, askUDP(t, s, addr), c.want)
			if got, err := lookup(dnsStreamTo(t, s, addr)); err != nil || got != c.want {
				t.Fatalf("first resolver %s, over TCP at %s: %s, %v", c.first, addr, got, err)
			}
		}
	}
}

// TestSlotBoundsDNSQueriesWaitingForTheirUpstream asks for many new names
// of an upstream that never answers, each query holding a host socket
// until it times out: at most 64 of a slot's wait at once, and no more
// than the host's socket budget across slots; the rest are dropped and
// counted, and nothing else reaches the upstream.
func TestSlotBoundsDNSQueriesWaitingForTheirUpstream(t *testing.T) {
	inet := nettest.NewInternet(t)
	pc := inet.ListenPacket(t, "udp4", nettest.HostIPv4.String()+":0")
	var received atomic.Int32
	go func() {
		buf := make([]byte, 65535)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			received.Add(1)
		}
	}()
	silent := netip.MustParseAddrPort(pc.LocalAddr().String())

	// ask sends n queries for new names from s's guest without waiting for answers.
	ask := func(s *netslot.Slot, n int) {
		t.Helper()
		c, err := nettest.Dial(t.Context(), s.Path(), "udp", linkDNS)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := range n {
			q, _ := new(dns.Msg).SetQuestion(fmt.Sprintf("q%d.example.com.", i), dns.TypeA).Pack()
			if _, err := c.Write(q); err != nil {
				t.Fatal(err)
			}
		}
	}
	// settle waits until the upstream received want queries and the slots dropped dropped.
	settle := func(counters *netslot.Counters, want int32, dropped uint64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for received.Load() != want || counters.DNSDropped.Load() != dropped {
			if time.Now().After(deadline) {
				t.Fatalf("the upstream received %d queries and the slots dropped %d, want %d and %d",
					received.Load(), counters.DNSDropped.Load(), want, dropped)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	counters := new(netslot.Counters)
	s := newSlotWith(t, netslot.Config{DeploymentResolvers: []netip.AddrPort{silent}, Counters: counters})
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	ask(s, 200)
	settle(counters, 64, 136)

	// Two slots sharing a budget of 10 sockets: 10 queries wait, of both.
	budget := netslot.NewSocketBudget(10)
	received.Store(0)
	shared := new(netslot.Counters)
	a := newSlotWith(t, netslot.Config{DeploymentResolvers: []netip.AddrPort{silent}, Counters: shared, Sockets: budget})
	b := newSlotWith(t, netslot.Config{DeploymentResolvers: []netip.AddrPort{silent}, Counters: shared, Sockets: budget})
	a.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	b.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	ask(a, 6)
	settle(shared, 6, 0)
	ask(b, 6)
	settle(shared, 10, 2)
}

// bigResolver serves DNS over UDP and TCP at one address of the test host.
// A TXT query for "<n>.big.test." is answered over TCP with TXT records
// that make the answer n bytes long; over UDP with the truncated bit, so
// the slot asks again over TCP.
func bigResolver(t *testing.T, inet *nettest.Internet) netip.AddrPort {
	pc := inet.ListenPacket(t, "udp4", nettest.HostIPv4.String()+":0")
	addr := netip.MustParseAddrPort(pc.LocalAddr().String())
	l := inet.Listen(t, "tcp4", addr.String())
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg).SetReply(q)
		if _, udp := w.LocalAddr().(*net.UDPAddr); udp {
			r.Truncated = true
			w.WriteMsg(r)
			return
		}
		var size int
		fmt.Sscanf(q.Question[0].Name, "%d.", &size)
		r.Compress = true // as the slot's cache sends it on
		txt := func(n int) dns.RR {
			return &dns.TXT{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 300},
				Txt: []string{strings.Repeat("x", n)}}
		}
		for r.Len()+268 < size { // a record of 255 bytes takes 268
			r.Answer = append(r.Answer, txt(255))
		}
		r.Answer = append(r.Answer, txt(0))
		rest := size - r.Len()
		if rest < 0 || rest > 255 {
			t.Errorf("no answer of %d bytes: %d left for the last record", size, rest)
			return
		}
		r.Answer[len(r.Answer)-1] = txt(rest)
		w.WriteMsg(r)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: handler}, {Listener: l, Handler: handler}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}
	return addr
}

// askBig queries the slot's link DNS address over UDP, offering EDNS0's
// largest size, for name's TXT records.
func askBig(t *testing.T, s *netslot.Slot, name string) (*dns.Msg, error) {
	t.Helper()
	q := new(dns.Msg).SetQuestion(name, dns.TypeTXT)
	q.SetEdns0(dns.MaxMsgSize, false)
	return exchangeUDP(t, s, linkDNS, q, dns.MaxMsgSize)
}

// Cached answers near the largest a datagram carries: one too large for a
// datagram is cut (with the truncated bit), not lost; one too large for a
// packet on the link is sent in fragments and counted once.
func TestSlotDNSLargeCachedAnswers(t *testing.T) {
	inet := nettest.NewInternet(t)
	counters := new(netslot.Counters)
	s := newSlotWith(t, netslot.Config{DeploymentResolvers: []netip.AddrPort{bigResolver(t, inet)}, Counters: counters})
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
	for _, size := range []int{65490, 65500, 65535} {
		name := fmt.Sprintf("%d.big.test.", size)
		before := counters.DNSCached.Load()
		for i := range 3 { // forwarded once, then from the cache
			r, err := askBig(t, s, name)
			if err != nil {
				t.Fatalf("%s, query %d: %v", name, i+1, err)
			}
			r.Compress = true // as it came
			if packed, _ := r.Pack(); len(packed) > 65507 || (!r.Truncated && len(r.Answer) == 0) {
				t.Fatalf("%s, query %d: an answer of %d bytes, truncated %v, %d records", name, i+1, len(packed), r.Truncated, len(r.Answer))
			}
		}
		if n := counters.DNSCached.Load() - before; n != 2 {
			t.Errorf("%s: counted %d answers from the cache, want 2", name, n)
		}
	}
}
