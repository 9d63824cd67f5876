package dnsforward

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// cacheZone answers as an upstream whose records carry these TTLs:
//
//	a.test.         A 192.0.2.1, TTL 30, and an NS in authority with TTL 600
//	zero.test.      A, TTL 0
//	nx.test.        NXDOMAIN, SOA with TTL 600 and MINIMUM 60
//	long-nx.test.   NXDOMAIN, SOA with TTL and MINIMUM 86400
//	nodata.test.    NOERROR without answers, SOA with MINIMUM 20
//	bare-nx.test.   NXDOMAIN without an SOA
//	fail.test.      SERVFAIL
//	tc.test.        an A record with the TC bit
//	nN.test.        A, TTL 300 (any N)
func cacheZone(q *dns.Msg) *dns.Msg {
	m := new(dns.Msg).SetReply(q)
	name := strings.ToLower(q.Question[0].Name)
	a := func(ttl uint32) dns.RR {
		return &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
			A: net.IPv4(192, 0, 2, 1)}
	}
	soa := func(ttl, minimum uint32) dns.RR {
		return &dns.SOA{Hdr: dns.RR_Header{Name: "test.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: ttl},
			Ns: "ns.test.", Mbox: "admin.test.", Serial: 1, Refresh: 1, Retry: 1, Expire: 1, Minttl: minimum}
	}
	switch {
	case name == "a.test.":
		m.Answer = []dns.RR{a(30)}
		m.Ns = []dns.RR{&dns.NS{Hdr: dns.RR_Header{Name: "test.", Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: 600}, Ns: "ns.test."}}
	case name == "zero.test.":
		m.Answer = []dns.RR{a(0)}
	case name == "nx.test.":
		m.Rcode, m.Ns = dns.RcodeNameError, []dns.RR{soa(600, 60)}
	case name == "long-nx.test.":
		m.Rcode, m.Ns = dns.RcodeNameError, []dns.RR{soa(86400, 86400)}
	case name == "nodata.test.":
		m.Ns = []dns.RR{soa(600, 20)}
	case name == "bare-nx.test.":
		m.Rcode = dns.RcodeNameError
	case name == "fail.test.":
		m.Rcode = dns.RcodeServerFailure
	case name == "tc.test.":
		m.Answer, m.Truncated = []dns.RR{a(300)}, true
	default:
		m.Answer = []dns.RR{a(300)}
	}
	if opt := q.IsEdns0(); opt != nil {
		m.SetEdns0(4096, opt.Do())
	}
	return m
}

// cacheEnv is a Cache in front of a cacheZone upstream that counts the
// queries it receives, on a clock the test moves.
type cacheEnv struct {
	t        *testing.T
	cache    *Cache
	fwd      *Forwarder
	received atomic.Int32
	mu       sync.Mutex
	clock    time.Time
}

func newCacheEnv(t *testing.T) *cacheEnv {
	e := &cacheEnv{t: t, cache: NewCache(), clock: time.Unix(1_000_000, 0)}
	e.cache.now = func() time.Time {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.clock
	}
	address := udpResponder(t, func(_ int, q *dns.Msg) []*dns.Msg {
		e.received.Add(1)
		return []*dns.Msg{cacheZone(q)}
	})
	e.fwd = &Forwarder{Upstream: Upstream{Protocol: UDP, Address: address}, Dial: direct, Timeout: 2 * time.Second}
	return e
}

func (e *cacheEnv) advance(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.clock = e.clock.Add(d)
}

// ask sends m through the cache and checks that the reply answers it with
// rcode and came from where it should.
func (e *cacheEnv) ask(m *dns.Msg, rcode int, want Source) *dns.Msg {
	e.t.Helper()
	b, err := m.Pack()
	if err != nil {
		e.t.Fatal(err)
	}
	reply, source := e.cache.Answer(e.t.Context(), e.fwd, b)
	if source != want {
		e.t.Fatalf("%s: answered by %d, want %d", m.Question[0].Name, source, want)
	}
	return unpackReply(e.t, m, reply, rcode)
}

func question(name string, qtype uint16) *dns.Msg { return new(dns.Msg).SetQuestion(name, qtype) }

func TestCacheServesUntilTheSmallestTTL(t *testing.T) {
	e := newCacheEnv(t)
	first := e.ask(question("a.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)
	e.advance(10 * time.Second)
	q := question("A.Test.", dns.TypeA) // another ID, another case
	second := e.ask(q, dns.RcodeSuccess, Cached)
	if n := e.received.Load(); n != 1 {
		t.Fatalf("the upstream received %d queries, want 1", n)
	}
	if second.Question[0].Name != "A.Test." {
		t.Errorf("question %q, want the query's own case", second.Question[0].Name)
	}
	if got, want := second.Answer[0].Header().Ttl, first.Answer[0].Header().Ttl-10; got != want {
		t.Errorf("answer TTL %d after 10s, want %d", got, want)
	}
	if got := second.Ns[0].Header().Ttl; got != 590 {
		t.Errorf("authority TTL %d after 10s, want 590", got)
	}
	if second.Authoritative {
		t.Error("a cached answer is marked authoritative")
	}
	// The smallest TTL, 30s, ends the entry.
	e.advance(20 * time.Second)
	e.ask(question("a.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)
	if n := e.received.Load(); n != 2 {
		t.Fatalf("the upstream received %d queries after the TTL, want 2", n)
	}
}

// Replies given within one second may share their bytes; each still has
// its query's ID, case and OPT record, and the next second's TTLs.
func TestCacheRepliesInOneSecond(t *testing.T) {
	e := newCacheEnv(t)
	first := e.ask(question("a.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)
	ttl := first.Answer[0].Header().Ttl
	e.advance(1500 * time.Millisecond)
	edns := question("a.test.", dns.TypeA)
	edns.SetEdns0(1232, false)
	for i, q := range []*dns.Msg{question("a.test.", dns.TypeA), question("a.test.", dns.TypeA), question("A.TEST.", dns.TypeA), edns,
		question("a.test.", dns.TypeA)} {
		r := e.ask(q, dns.RcodeSuccess, Cached) // the query's ID and question
		if got := r.Answer[0].Header().Ttl; got != ttl-1 {
			t.Errorf("reply %d: TTL %d after 1.5s, want %d", i, got, ttl-1)
		}
		if (r.IsEdns0() != nil) != (q.IsEdns0() != nil) {
			t.Errorf("reply %d: OPT record %v to a query with %v", i, r.IsEdns0(), q.IsEdns0())
		}
	}
	e.advance(time.Second)
	if r := e.ask(question("a.test.", dns.TypeA), dns.RcodeSuccess, Cached); r.Answer[0].Header().Ttl != ttl-2 {
		t.Errorf("TTL %d after 2.5s, want %d", r.Answer[0].Header().Ttl, ttl-2)
	}
}

func TestCacheKeysTypeClassAndFlags(t *testing.T) {
	e := newCacheEnv(t)
	e.ask(question("n1.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)
	e.ask(question("n1.test.", dns.TypeAAAA), dns.RcodeSuccess, Forwarded)
	chaos := question("n1.test.", dns.TypeA)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	e.ask(chaos, dns.RcodeSuccess, Forwarded)
	cd := question("n1.test.", dns.TypeA)
	cd.CheckingDisabled = true
	e.ask(cd, dns.RcodeSuccess, Forwarded)
	norec := question("n1.test.", dns.TypeA)
	norec.RecursionDesired = false
	e.ask(norec, dns.RcodeSuccess, Forwarded)
	do := question("n1.test.", dns.TypeA)
	do.SetEdns0(1232, true)
	e.ask(do, dns.RcodeSuccess, Forwarded)
	// EDNS0 without DO shares the plain query's entry.
	edns := question("n1.test.", dns.TypeA)
	edns.SetEdns0(1232, false)
	e.ask(edns, dns.RcodeSuccess, Cached)
	e.ask(do, dns.RcodeSuccess, Cached)
	if n := e.received.Load(); n != 6 {
		t.Fatalf("the upstream received %d queries, want 6", n)
	}
}

func TestCacheOPTFollowsTheQuery(t *testing.T) {
	e := newCacheEnv(t)
	edns := question("n2.test.", dns.TypeA)
	edns.SetEdns0(1232, false)
	e.ask(edns, dns.RcodeSuccess, Forwarded)
	if r := e.ask(question("n2.test.", dns.TypeA), dns.RcodeSuccess, Cached); r.IsEdns0() != nil {
		t.Error("a query without OPT got one back")
	}
	if r := e.ask(edns, dns.RcodeSuccess, Cached); r.IsEdns0() == nil {
		t.Error("a query with OPT got none back")
	}
}

func TestCacheNegativeAnswers(t *testing.T) {
	e := newCacheEnv(t)
	// NXDOMAIN: kept for the SOA's MINIMUM, 60s, not its TTL.
	e.ask(question("nx.test.", dns.TypeA), dns.RcodeNameError, Forwarded)
	e.advance(59 * time.Second)
	r := e.ask(question("nx.test.", dns.TypeA), dns.RcodeNameError, Cached)
	if got := r.Ns[0].Header().Ttl; got != 600-59 {
		t.Errorf("SOA TTL %d, want %d", got, 600-59)
	}
	e.advance(time.Second)
	e.ask(question("nx.test.", dns.TypeA), dns.RcodeNameError, Forwarded)

	// NODATA likewise.
	e.ask(question("nodata.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)
	e.advance(19 * time.Second)
	e.ask(question("nodata.test.", dns.TypeA), dns.RcodeSuccess, Cached)
	e.advance(time.Second)
	e.ask(question("nodata.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)

	// A day's negative TTL is bounded.
	e.ask(question("long-nx.test.", dns.TypeA), dns.RcodeNameError, Forwarded)
	e.advance(cacheMaxNegativeTTL - time.Second)
	e.ask(question("long-nx.test.", dns.TypeA), dns.RcodeNameError, Cached)
	e.advance(time.Second)
	e.ask(question("long-nx.test.", dns.TypeA), dns.RcodeNameError, Forwarded)
}

func TestCacheKeepsNothingElse(t *testing.T) {
	for _, c := range []struct {
		name  string
		rcode int
	}{
		{"bare-nx.test.", dns.RcodeNameError},   // negative without an SOA
		{"fail.test.", dns.RcodeServerFailure},  // SERVFAIL
		{"zero.test.", dns.RcodeSuccess},        // TTL 0
		{"tc.test.", dns.RcodeSuccess},          // truncated
		{"unreachable.test.", dns.RcodeSuccess}, // below: the upstream is gone
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newCacheEnv(t)
			if c.name == "unreachable.test." {
				e.fwd.Upstream.Address = "127.0.0.1:1"
				c.rcode = dns.RcodeServerFailure
			}
			for range 2 {
				e.ask(question(c.name, dns.TypeA), c.rcode, Forwarded)
			}
		})
	}
	e := newCacheEnv(t)
	notify := question("n3.test.", dns.TypeSOA)
	notify.Opcode = dns.OpcodeNotify
	for range 2 {
		b, _ := notify.Pack()
		if _, source := e.cache.Answer(t.Context(), e.fwd, b); source != Forwarded {
			t.Fatalf("a NOTIFY was answered by %d", source)
		}
	}
}

func TestCacheClearForgetsEverything(t *testing.T) {
	e := newCacheEnv(t)
	e.ask(question("n4.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)
	e.cache.Clear()
	e.ask(question("n4.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)
}

// An exchange under way when Clear comes stores nothing: its answer is
// from before the change.
func TestCacheClearDuringExchange(t *testing.T) {
	e := newCacheEnv(t)
	asked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	address := udpResponder(t, func(_ int, q *dns.Msg) []*dns.Msg {
		once.Do(func() { close(asked) })
		<-release
		return []*dns.Msg{cacheZone(q)}
	})
	e.fwd.Upstream.Address = address
	done := make(chan struct{})
	go func() {
		defer close(done)
		b, _ := question("n5.test.", dns.TypeA).Pack()
		e.cache.Answer(t.Context(), e.fwd, b)
	}()
	<-asked // the query is at the upstream
	e.cache.Clear()
	close(release)
	<-done
	b, _ := question("n5.test.", dns.TypeA).Pack()
	if _, ok := e.cache.Lookup(b); ok {
		t.Fatal("an answer from before Clear was kept")
	}
}

func TestCacheBounds(t *testing.T) {
	e := newCacheEnv(t)
	for i := range cacheMaxEntries + 100 {
		b, _ := question(fmt.Sprintf("n%d.test.", i), dns.TypeA).Pack()
		e.cache.Answer(t.Context(), e.fwd, b)
	}
	e.cache.mu.Lock()
	n, bytes := len(e.cache.entries), e.cache.bytes
	e.cache.mu.Unlock()
	if n > cacheMaxEntries || bytes > cacheMaxBytes {
		t.Fatalf("%d entries of %d bytes, bounds %d and %d", n, bytes, cacheMaxEntries, cacheMaxBytes)
	}
	// The newest is in.
	b, _ := question(fmt.Sprintf("n%d.test.", cacheMaxEntries+99), dns.TypeA).Pack()
	if _, ok := e.cache.Lookup(b); !ok {
		t.Fatal("the newest answer was not kept")
	}
}

func TestCacheNilForwardsEverything(t *testing.T) {
	e := newCacheEnv(t)
	e.cache = nil
	for range 2 {
		e.ask(question("n6.test.", dns.TypeA), dns.RcodeSuccess, Forwarded)
	}
}

func TestCacheMalformedQuery(t *testing.T) {
	e := newCacheEnv(t)
	if reply, source := e.cache.Answer(t.Context(), e.fwd, []byte{1, 2, 3}); reply != nil || source != Local {
		t.Fatalf("a 3-byte query: %v, %d", reply, source)
	}
	if _, ok := e.cache.Lookup([]byte{1, 2, 3}); ok {
		t.Fatal("Lookup answered a 3-byte query")
	}
}

// Queries, Clear and expiry at once: every reply still answers its query.
func TestCacheConcurrent(t *testing.T) {
	e := newCacheEnv(t)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 50 {
				q := question(fmt.Sprintf("n%d.test.", (w+i)%5), dns.TypeA)
				b, _ := q.Pack()
				reply, _ := e.cache.Answer(t.Context(), e.fwd, b)
				var r dns.Msg
				if err := r.Unpack(reply); err != nil || r.Id != q.Id || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
					t.Errorf("reply %v, %v to query %d", &r, err, q.Id)
					return
				}
				switch i % 10 {
				case 0:
					e.cache.Clear()
				case 5:
					e.advance(100 * time.Second)
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkCacheLookup answers a guest's repeated query from the cache.
func BenchmarkCacheLookup(b *testing.B) {
	c := NewCache()
	q := question("a.test.", dns.TypeA)
	answer, err := cacheZone(q).Pack()
	if err != nil {
		b.Fatal(err)
	}
	key, _ := keyOf(q)
	c.store(0, key, answer, time.Now())
	query, _ := q.Pack()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := c.Lookup(query); !ok {
			b.Fatal("not cached")
		}
	}
}
