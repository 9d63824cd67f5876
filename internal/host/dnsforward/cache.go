package dnsforward

import (
	"bytes"
	"context"
	"encoding/binary"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Cache limits: a workspace's guest gets at most this much memory of
// answers, and no answer is kept longer than these bounds however long its
// records say.
const (
	cacheMaxEntries = 4096
	cacheMaxBytes   = 1 << 20
	// cacheMaxTTL bounds how long a positive answer is kept.
	cacheMaxTTL = time.Hour
	// cacheMaxNegativeTTL bounds how long an NXDOMAIN or NODATA answer is
	// kept (RFC 2308 5 suggests one to three hours; shorter here, so that a
	// name created upstream appears soon).
	cacheMaxNegativeTTL = 5 * time.Minute
	// cacheEvictSample is how many entries an insert into a full cache
	// looks at for one to evict: an expired one when there is one, else
	// any.
	cacheEvictSample = 8
)

// Source is how a query was answered.
type Source int

const (
	// Local: answered without an exchange (FORMERR, or dropped).
	Local Source = iota
	// Cached: answered from the Cache.
	Cached
	// Forwarded: answered through an exchange with the upstream, or
	// SERVFAIL when that exchange failed.
	Forwarded
)

// Cache keeps the upstream's answers for as long as their records' TTLs
// allow (RFC 1035 7.4), NXDOMAIN and NODATA answers as RFC 2308 says
// (bounded to cacheMaxNegativeTTL), and serves them with each TTL
// decremented by the time spent in the cache. It is keyed by the question's
// name (case-insensitive), type and class and by the query's RD, CD and
// DO bits, which change what an upstream answers. It keeps nothing else:
// not SERVFAIL or REFUSED, not a truncated answer, not an answer with a
// record of TTL zero, not a negative answer without an SOA, not an answer
// to an opcode other than QUERY or to a zone transfer.
//
// A Cache belongs to one upstream and one configuration of it: its owner
// makes a new one, or calls Clear, whenever what the upstream would answer
// may change. The zero value is not usable; use NewCache. It is safe for
// concurrent use.
type Cache struct {
	// now is the clock; tests replace it.
	now func() time.Time

	mu      sync.Mutex
	entries map[cacheKey]*cacheEntry
	bytes   int
	// generation counts Clear calls: an exchange that began before a
	// Clear stores nothing.
	generation uint64
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{now: time.Now, entries: map[cacheKey]*cacheEntry{}}
}

type cacheKey struct {
	name          string // lower case
	qtype, qclass uint16
	rd, cd, do    bool
}

type cacheEntry struct {
	// reply is the upstream's answer, without its OPT record.
	reply   *dns.Msg
	size    int // of the answer's wire form, what the byte bound counts
	stored  time.Time
	expires time.Time
	// last is the reply replyTo built last. A guest asks the same question
	// the same way, again and again, within a second: it gets these bytes
	// again with its own ID, without a packing.
	last atomic.Pointer[builtReply]
}

// builtReply is a reply in wire form and what it was built for.
type builtReply struct {
	name string // the question's, in the query's case
	opt  bool   // the query had an OPT record
	age  uint32 // seconds the answer had spent in the cache
	wire []byte
}

// Clear forgets every answer, including those of exchanges under way.
func (c *Cache) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
	c.bytes = 0
	c.generation++
}

// Answer answers query as f.Answer does, from c when c holds its answer;
// an answer f gets from the upstream is kept when it may be. A reply from
// c has the query's ID and question, each record's TTL decremented by the
// seconds it spent in c, and an OPT record exactly when the query has one.
// A nil Cache keeps nothing: every query is forwarded.
func (c *Cache) Answer(ctx context.Context, f *Forwarder, query []byte) ([]byte, Source) {
	q, reply := parse(query)
	if q == nil {
		return reply, Local
	}
	key, ok := keyOf(q)
	if c == nil || !ok {
		return f.answer(ctx, q, query), Forwarded
	}
	reply, generation := c.lookup(key, q)
	if reply != nil {
		return reply, Cached
	}
	answer := f.answer(ctx, q, query)
	c.store(generation, key, answer, c.now())
	return answer, Forwarded
}

// Lookup returns the reply to query from c, as Answer would give it, or
// false when c does not hold one: then Answer forwards it. It lets a
// caller answer from memory at once and hand only the rest to a goroutine.
func (c *Cache) Lookup(query []byte) ([]byte, bool) {
	var q dns.Msg
	if q.Unpack(query) != nil || q.Response || len(q.Question) != 1 {
		return nil, false
	}
	key, ok := keyOf(&q)
	if !ok {
		return nil, false
	}
	reply, _ := c.lookup(key, &q)
	return reply, reply != nil
}

// lookup returns the reply to q, whose key is key, or nil, with the
// generation an exchange begun now stores under.
func (c *Cache) lookup(key cacheKey, q *dns.Msg) ([]byte, uint64) {
	c.mu.Lock()
	e := c.entries[key]
	generation := c.generation
	c.mu.Unlock()
	if now := c.now(); e != nil && now.Before(e.expires) {
		return e.replyTo(q, now), generation
	}
	return nil, generation
}

// keyOf is the key of a query whose answer may be cached.
func keyOf(q *dns.Msg) (cacheKey, bool) {
	qs := q.Question[0]
	if q.Opcode != dns.OpcodeQuery || qs.Qtype == dns.TypeAXFR || qs.Qtype == dns.TypeIXFR {
		return cacheKey{}, false
	}
	k := cacheKey{name: strings.ToLower(qs.Name), qtype: qs.Qtype, qclass: qs.Qclass,
		rd: q.RecursionDesired, cd: q.CheckingDisabled}
	if opt := q.IsEdns0(); opt != nil {
		k.do = opt.Do()
	}
	return k, true
}

// store keeps answer under key when it may be cached and no Clear came
// since generation.
func (c *Cache) store(generation uint64, key cacheKey, answer []byte, now time.Time) {
	var r dns.Msg
	if r.Unpack(answer) != nil || r.Truncated {
		return
	}
	ttl, ok := cacheTTL(&r)
	if !ok {
		return
	}
	r.Extra = withoutOPT(r.Extra)
	e := &cacheEntry{reply: &r, size: len(answer), stored: now, expires: now.Add(ttl)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if generation != c.generation || e.size > cacheMaxBytes {
		return
	}
	if old := c.entries[key]; old != nil {
		c.bytes -= old.size
		delete(c.entries, key)
	}
	for len(c.entries) >= cacheMaxEntries || c.bytes+e.size > cacheMaxBytes {
		c.evictOne(now)
	}
	c.entries[key] = e
	c.bytes += e.size
}

// evictOne removes an expired entry among a few, or else the first of
// them (the map's order is random).
func (c *Cache) evictOne(now time.Time) {
	var victim cacheKey
	seen := 0
	for k, e := range c.entries {
		if seen == 0 || !now.Before(e.expires) {
			victim = k
		}
		if seen++; seen == cacheEvictSample || !now.Before(e.expires) {
			break
		}
	}
	c.bytes -= c.entries[victim].size
	delete(c.entries, victim)
}

// cacheTTL is how long r may be kept: its records' smallest TTL, and for
// a negative answer (NXDOMAIN, or NOERROR without answer records) no longer
// than its SOA's MINIMUM (RFC 2308 5); false when r is not to be kept.
func cacheTTL(r *dns.Msg) (time.Duration, bool) {
	negative := r.Rcode == dns.RcodeNameError || (r.Rcode == dns.RcodeSuccess && len(r.Answer) == 0)
	if r.Rcode != dns.RcodeSuccess && !negative {
		return 0, false
	}
	limit := cacheMaxTTL
	if negative {
		limit = cacheMaxNegativeTTL
	}
	ttl := uint32(limit / time.Second)
	soa := false
	for _, section := range [][]dns.RR{r.Answer, r.Ns, r.Extra} {
		for _, rr := range section {
			if rr.Header().Rrtype == dns.TypeOPT {
				continue
			}
			ttl = min(ttl, rr.Header().Ttl)
			if s, ok := rr.(*dns.SOA); ok && negative {
				soa = true
				ttl = min(ttl, s.Minttl)
			}
		}
	}
	if ttl == 0 || (negative && !soa) {
		return 0, false
	}
	return time.Duration(ttl) * time.Second, true
}

func withoutOPT(rrs []dns.RR) []dns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		if rr.Header().Rrtype != dns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}

// replyTo builds the reply to q from the entry at now; nil when it cannot
// be packed.
func (e *cacheEntry) replyTo(q *dns.Msg, now time.Time) []byte {
	age := uint32(now.Sub(e.stored) / time.Second)
	opt := q.IsEdns0()
	if last := e.last.Load(); last != nil && last.age == age && last.opt == (opt != nil) && last.name == q.Question[0].Name {
		b := bytes.Clone(last.wire)
		binary.BigEndian.PutUint16(b, q.Id)
		return b
	}
	b := e.build(q, opt, age)
	if b != nil {
		e.last.Store(&builtReply{name: q.Question[0].Name, opt: opt != nil, age: age, wire: bytes.Clone(b)})
	}
	return b
}

// build is the reply to q, which has OPT record opt, after age seconds in
// the cache.
func (e *cacheEntry) build(q *dns.Msg, opt *dns.OPT, age uint32) []byte {
	r := &dns.Msg{MsgHdr: e.reply.MsgHdr, Compress: true}
	r.Id = q.Id
	// Not from the authority itself any more.
	r.Authoritative = false
	r.Question = q.Question
	r.Answer = aged(e.reply.Answer, age)
	r.Ns = aged(e.reply.Ns, age)
	r.Extra = aged(e.reply.Extra, age)
	if opt != nil {
		// RFC 6891 7: a query with an OPT record gets one back.
		r.SetEdns0(ednsSize, opt.Do())
	}
	return pack(r)
}

// aged copies rrs with each TTL decremented by age seconds; the entry
// expires before any reaches zero.
func aged(rrs []dns.RR, age uint32) []dns.RR {
	if len(rrs) == 0 {
		return nil
	}
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		if age == 0 {
			out[i] = rr // packing does not change it
			continue
		}
		cp := dns.Copy(rr)
		cp.Header().Ttl -= age
		out[i] = cp
	}
	return out
}
