package netslot

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"

	"github.com/kibotos/kibotos/internal/host/dnsforward"
	"github.com/kibotos/kibotos/internal/host/netpolicy"
)

const (
	dnsPort = 53
	// dnsStreamIdle ends a guest's idle DNS-over-TCP connection.
	dnsStreamIdle = 30 * time.Second
	// maxDNSStreams bounds a slot's DNS-over-TCP connections at once,
	// and dnsStreamBuffer the send and receive buffers of each: a message
	// is at most 64 KiB and 2 bytes. The memory a guest can make the
	// slot hold there is in the host agent's process, not the guest's
	// cgroup, so it is kept small (about 4 MiB a slot) whatever the
	// guest does (queries it never reads the answers of).
	maxDNSStreams   = 16
	dnsStreamBuffer = 128 << 10
	// maxDNSExchanges bounds a slot's UDP queries waiting for their
	// upstream at once: each holds a host socket and a goroutine until it
	// is answered or times out (5 s), and a guest asking for new names of
	// an upstream that does not answer would otherwise take the process's
	// file descriptors. A query over it is dropped, as a busy resolver
	// would drop it: the guest asks again.
	maxDNSExchanges = 64
)

// serveDNS answers UDP queries at both link DNS addresses (the link
// guard answers most before they reach the stack).
func (s *Slot) serveDNS() error {
	if err := s.serveDNSAt(linkDNS4, ipv4.ProtocolNumber); err != nil {
		return err
	}
	return s.serveDNSAt(linkDNS6, ipv6.ProtocolNumber)
}

// serveDNSAt answers UDP queries at la, a link DNS address.
func (s *Slot) serveDNSAt(la netip.Addr, proto tcpip.NetworkProtocolNumber) error {
	conn, err := gonet.DialUDP(s.stack, &tcpip.FullAddress{NIC: nicID, Addr: tcpipAddr(la), Port: dnsPort}, nil, proto)
	if err != nil {
		return err
	}
	context.AfterFunc(s.ctx, func() { conn.Close() })
	s.wg.Go(func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			reply := func(resp []byte) {
				if resp != nil {
					// An answer may not fit (one a TCP, TLS or HTTPS
					// upstream gave, or a UDP one over TCP): the guest
					// then retries over TCP.
					conn.WriteTo(dnsforward.FitUDP(q, resp), from)
				}
			}
			// What the slot answers without an exchange is answered here
			// (the link guard answers most of it before the stack sees it);
			// the rest waits for the upstream in a goroutine of its own.
			resp, a, fwd, answered, cached := s.quickAnswer(q)
			if answered {
				if cached {
					s.cfg.Counters.DNSCached.Add(1)
				}
				reply(resp)
				continue
			}
			if !take(s.exchanges, s.cfg.Sockets) {
				s.cfg.Counters.DNSDropped.Add(1)
				continue
			}
			q = bytes.Clone(q)
			s.wg.Go(func() {
				defer give(s.exchanges, s.cfg.Sockets)
				reply(s.forward(a.cache, fwd, q))
			})
		}
	})
	return nil
}

// quickAnswer answers a UDP query that needs no exchange: as the policy in
// force says without one (dnsRoute), or from the cache (cached: the caller
// counts the answer once it sends it). Otherwise it returns the
// application and the forwarder to ask, and false.
func (s *Slot) quickAnswer(q []byte) (resp []byte, a *applied, fwd *dnsforward.Forwarder, answered, cached bool) {
	a, fwd, resp = s.dnsRoute(q)
	if fwd == nil {
		return resp, a, nil, true, false
	}
	if resp, ok := a.cache.Lookup(q); ok {
		return resp, a, fwd, true, true
	}
	return nil, a, fwd, false, false
}

// answerDatagram answers the guest's UDP query in packet, to the link DNS
// address, when it needs no exchange (quickAnswer), writing the answer to
// the TUN device; false leaves the packet to the stack and serveDNS.
func (s *Slot) answerDatagram(packet []byte) bool {
	from, to, q, ok := parseDatagram(packet)
	if !ok {
		return false
	}
	resp, _, _, answered, cached := s.quickAnswer(q)
	if !answered {
		return false
	}
	if resp == nil {
		return true // dropped, as serveDNS would
	}
	// A cached answer of a TCP, TLS or HTTPS upstream may not fit: the
	// guest then asks again over TCP.
	answer := udpPacket(to, from, dnsforward.FitUDP(q, resp))
	if len(answer) > MTU {
		return false // the stack fragments it, and serveDNS counts it
	}
	if cached {
		s.cfg.Counters.DNSCached.Add(1)
	}
	s.inject(answer)
	return true
}

// dnsStream is a guest's TCP connection to the link DNS address. It
// answers as the assignment in force says, until an update of the Resolver
// it uses replaces that Resolver's revision: then it keeps the replaced
// revision until the update's drain runs out, and closes.
type dnsStream struct {
	// Under the slot's lock.
	conn     net.Conn      // nil until its handshake completed
	closed   bool          // closed before conn was set
	resolver *resolverPath // the Resolver revision it is on; nil: none
	drain
}

// close closes the stream, or has it closed once it is connected; the
// slot's lock is held.
func (st *dnsStream) close() {
	if st.conn == nil {
		st.closed = true
		return
	}
	st.conn.Close()
}

// closeDNSStream closes st (its drain ran out).
func (s *Slot) closeDNSStream(st *dnsStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.close()
}

// follow moves a stream of s onto a, or starts its drain when a replaces
// the revision of its Resolver; it reports true when the drain is zero and
// the caller must close the stream now. A stream draining on a Resolver that a
// no longer names (another one, none, DENY_ALL: no query leaves the slot)
// ends its drain and answers as a says; one a still names keeps the
// deadline of the update that started its drain.
func (st *dnsStream) follow(s *Slot, a *applied) bool {
	old, now := st.resolver, a.resolver
	sameResolver := old != nil && now != nil && old.key == now.key
	switch {
	case st.draining() && sameResolver:
		return false // an earlier update's deadline holds
	case sameResolver && old.revision != now.revision:
		return st.startDrain(now.drain, func() { s.closeDNSStream(st) })
	}
	st.stopDrain()
	st.resolver = now
	return false
}

// throughEgress reports whether the stream drains through one of the
// Egresses deleted.
func (st *dnsStream) throughEgress(deleted map[string]bool) bool {
	return st.draining() && st.resolver != nil && deleted[st.resolver.path.GetEgressId()]
}

// trackDNSStream registers a guest's DNS stream on the Resolver revision in
// force; false when the slot is closed or has maxDNSStreams already.
func (s *Slot) trackDNSStream(st *dnsStream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if len(s.dnsStreams) >= maxDNSStreams {
		s.cfg.Counters.Limited.Add(1)
		return false
	}
	if a := s.applied.Load(); a != nil {
		st.resolver = a.resolver
	}
	s.dnsStreams[st] = struct{}{}
	return true
}

// forgetDNSStream drops a closed DNS stream.
func (s *Slot) forgetDNSStream(st *dnsStream) {
	s.mu.Lock()
	delete(s.dnsStreams, st)
	draining := st.stopDrain()
	s.mu.Unlock()
	if draining {
		s.changed() // a draining revision may have ended
	}
}

// serveDNSStream answers length-prefixed queries on a guest's TCP
// connection to the link DNS address, tracked as st.
func (s *Slot) serveDNSStream(st *dnsStream, c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(s.ctx, func() { c.Close() })
	defer stop()
	s.mu.Lock()
	st.conn = c
	closeNow := st.closed
	s.mu.Unlock()
	if closeNow {
		return // a change closed it before its handshake completed
	}
	var size [2]byte
	for {
		c.SetReadDeadline(time.Now().Add(dnsStreamIdle))
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		resp := s.answerOn(st, q)
		if resp == nil {
			return
		}
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(resp))), resp...)); err != nil {
			return
		}
	}
}

// answerOn answers one query of a DNS stream: through the replaced
// Resolver revision, without the cache, while the stream drains on it, else
// as answer does.
func (s *Slot) answerOn(st *dnsStream, q []byte) []byte {
	s.mu.Lock()
	res := st.resolver
	draining := st.draining()
	s.mu.Unlock()
	if draining {
		return s.forward(nil, res.fwd, q)
	}
	return s.answer(q)
}

// answer answers one query as the policy in force says (dnsRoute).
func (s *Slot) answer(q []byte) []byte {
	a, fwd, resp := s.dnsRoute(q)
	if fwd == nil {
		return resp
	}
	return s.forward(a.cache, fwd, q)
}

// dnsRoute is how the application in force answers query: refused at once
// under DENY_ALL (nothing leaves the slot), else from the application's
// cache or through the policy's Resolver when it has one, else the first
// deployment resolver of the link's family (SERVFAIL at once when there is
// none). It returns the application and the forwarder, or a nil forwarder
// and the reply given without an exchange, counted.
func (s *Slot) dnsRoute(q []byte) (*applied, *dnsforward.Forwarder, []byte) {
	a := s.current()
	rcode := dns.RcodeRefused
	switch {
	case a == nil || a.policy.Mode != netpolicy.PublicInternet:
	case a.resolver != nil:
		return a, a.resolver.fwd, nil
	case s.deployment != nil:
		return a, s.deployment, nil
	default:
		rcode = dns.RcodeServerFailure
	}
	s.cfg.Counters.DNSLocal.Add(1)
	return a, nil, dnsforward.Fail(q, rcode)
}

// forward answers q from cache or through fwd, and counts how.
func (s *Slot) forward(cache *dnsforward.Cache, fwd *dnsforward.Forwarder, q []byte) []byte {
	resp, source := cache.Answer(s.ctx, fwd, q)
	switch source {
	case dnsforward.Cached:
		s.cfg.Counters.DNSCached.Add(1)
	case dnsforward.Forwarded:
		s.cfg.Counters.DNSForwarded.Add(1)
	default:
		s.cfg.Counters.DNSLocal.Add(1)
	}
	return resp
}

// deploymentResolver is the first deployment resolver in the link DNS
// address's family.
func (s *Slot) deploymentResolver() (string, bool) {
	want6 := LinkDNS(s.cfg.DeploymentResolvers).Is6()
	for _, r := range s.cfg.DeploymentResolvers {
		if r.Addr().Unmap().Is6() == want6 {
			return r.String(), true
		}
	}
	return "", false
}
