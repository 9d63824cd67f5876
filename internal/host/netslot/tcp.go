package netslot

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/kibotos/kibotos/internal/host/netpolicy"
	"github.com/kibotos/kibotos/internal/host/socks5"
)

// flow is one guest TCP connection the slot carries to a destination.
type flow struct {
	dst      netip.AddrPort
	decision netpolicy.Decision
	// policy is the policy the flow's path follows.
	policy *netpolicy.Policy
	// policyRevision is the policy revision whose path the flow is on;
	// egressRevision the Egress revision it went through, when forwarded.
	policyRevision uint64
	egressRevision uint64
	// Set under the slot's lock by a change that moved the flow.
	drain
	egressDraining bool // the drain is an Egress update's, not the policy's

	out net.Conn

	mu     sync.Mutex
	guest  *guestConn // nil until the guest's handshake completes
	closed bool
}

// drain is the deadline of a connection that a change moved off the path
// it keeps: the zero value is not draining.
type drain struct {
	timer *time.Timer
}

func (d *drain) draining() bool { return d.timer != nil }

// startDrain schedules closeConn after dur; it reports true when dur is
// zero and the caller must close the connection now.
func (d *drain) startDrain(dur time.Duration, closeConn func()) bool {
	if dur <= 0 {
		d.timer = time.NewTimer(0) // marks draining until closed
		return true
	}
	d.timer = time.AfterFunc(dur, closeConn)
	return false
}

// stopDrain cancels the deadline of a connection that closed or no longer
// drains; it reports whether the connection was draining.
func (d *drain) stopDrain() bool {
	if d.timer == nil {
		return false
	}
	d.timer.Stop()
	d.timer = nil
	return true
}

// close ends a flow whose directions have both ended.
func (f *flow) close() { f.end(func(c net.Conn) { c.Close() }) }

// cut ends a flow that a change, an Egress's deletion or the slot's end
// cuts short, with a reset each way: neither end takes the stream for
// complete.
func (f *flow) cut() { f.end(abort) }

// end ends each of the flow's connections with endConn, once.
func (f *flow) end(endConn func(net.Conn)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.closed = true
	if f.guest != nil {
		endConn(f.guest)
	}
	endConn(f.out)
}

// abort ends c with a reset, so that its peer learns that the stream was
// cut: a half-close or a close would tell it the stream was complete.
func abort(c net.Conn) {
	switch c := c.(type) {
	case *guestConn:
		c.ep.Abort()
	case *net.TCPConn:
		c.SetLinger(0)
	case *socks5.TLSStream:
		// Closing the TLS connection would send close_notify first, which
		// the Egress reads as the stream's end: reset the TCP connection
		// under it instead.
		abort(c.NetConn())
		return
	}
	c.Close()
}

// handleTCP decides a guest's new TCP connection: the SYN is answered only
// once the outbound leg is up, so a refused or failed connection is reset.
// It runs in a goroutine of its own (the forwarder's), which then carries
// the connection until it ends.
func (s *Slot) handleTCP(r *tcp.ForwarderRequest) {
	growStack()
	if !s.enter() {
		r.Complete(true)
		return
	}
	defer s.wg.Done()
	id := r.ID()
	dst := netip.AddrPortFrom(addrOf(id.LocalAddress), id.LocalPort)
	if isLinkDNS(dst.Addr()) && dst.Port() == dnsPort {
		// Tracked before its handshake completes: one over the bound is
		// reset, as the guest's other refused connections are.
		st := &dnsStream{}
		if !s.trackDNSStream(st) {
			r.Complete(true)
			return
		}
		defer s.forgetDNSStream(st)
		guest, err := accept(r, dnsStreamBuffer)
		if err == nil {
			s.cfg.Counters.DNS.Add(1)
			s.serveDNSStream(st, guest)
		}
		return
	}
	if !take(s.flows, s.cfg.Sockets) {
		s.cfg.Counters.Limited.Add(1)
		r.Complete(true)
		return
	}
	defer give(s.flows, s.cfg.Sockets)
	a := s.current()
	d := netpolicy.Decision{Action: netpolicy.Refuse, Reason: "no network policy is applied"}
	if a != nil {
		d = a.policy.Decide(netpolicy.TCP, dst.Addr(), s.hard.Load())
	}
	f := &flow{dst: dst, decision: d}
	var err error
	switch d.Action {
	case netpolicy.Direct:
		f.out, err = dialDirect(s.ctx, dst)
	case netpolicy.Forward:
		e := a.egresses[d.EgressID]
		f.egressRevision = e.revision
		f.out, err = e.dialer.DialContext(s.ctx, "tcp", dst.String())
		s.egressResult(e.id, err)
	default:
		s.refused(dst, d.Reason)
		r.Complete(true)
		return
	}
	if errors.Is(err, errHostAddress) {
		s.refused(dst, "it resolves to an address of the host")
		r.Complete(true)
		return
	}
	if err != nil {
		s.cfg.Counters.Unreachable.Add(1)
		s.logger().Debug("guest connection unreachable", "dst", dst, "err", err)
		r.Complete(true)
		return
	}
	out, ok := f.out.(halfCloser)
	if !ok {
		// Closing it whole for a half-close would cut off the answer.
		s.logger().Error("outbound connection cannot half-close", "type", fmt.Sprintf("%T", f.out))
		r.Complete(true)
		f.out.Close()
		return
	}
	// Tracked before the guest sees its handshake complete, so a change
	// applied from then on finds the connection open.
	f.policy, f.policyRevision = a.policy, a.revision
	if !s.track(f, a) {
		s.refused(dst, "a change of the policy or its Egress, applied while it was dialed, moved it")
		r.Complete(true)
		f.out.Close()
		return
	}
	guest, err := accept(r, 0)
	if err != nil {
		s.cutFlow(f)
		return
	}
	f.mu.Lock()
	f.guest = guest
	cut := f.closed
	f.mu.Unlock()
	if cut { // while the guest's handshake completed
		abort(guest)
		return
	}
	if d.Action == netpolicy.Forward {
		s.cfg.Counters.Egress.Add(1)
	} else {
		s.cfg.Counters.Direct.Add(1)
	}
	splice(guest, out)
	s.closeFlow(f)
}

// refused counts a guest connection the policy refused, and logs why at
// debug level (--log-level debug): the counters say how many, the log
// which and why.
func (s *Slot) refused(dst netip.AddrPort, reason string) {
	s.cfg.Counters.Refused.Add(1)
	s.logger().Debug("guest connection refused", "dst", dst, "reason", reason)
}

// halfCloser is a connection whose sending direction ends alone: the
// guest's (gonet), a direct one (*net.TCPConn) and an Egress's (socks5).
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// guestConn is the guest's end of a connection the slot carries.
type guestConn struct {
	*gonet.TCPConn
	ep tcpip.Endpoint // for abort
}

// accept completes the guest's handshake.
func accept(r *tcp.ForwarderRequest, bufferBytes int64) (*guestConn, error) {
	var wq waiter.Queue
	ep, err := r.CreateEndpoint(&wq)
	if err != nil {
		r.Complete(true)
		return nil, errors.New(err.String())
	}
	r.Complete(false)
	so := ep.SocketOptions()
	so.SetKeepAlive(true)
	if bufferBytes > 0 { // fixed: no auto-tuning up to the stack's maximum
		so.SetReceiveBufferSize(bufferBytes, true)
		so.SetSendBufferSize(bufferBytes, true)
	}
	return &guestConn{TCPConn: gonet.NewTCPConn(&wq, ep), ep: ep}, nil
}

// track registers a flow decided under a. A change applied while it was
// being dialed decides it again: when the change moves it, it is closed,
// since new connections take the new path.
func (s *Slot) track(f *flow, a *applied) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if now := s.applied.Load(); now != a {
		if now == nil || netpolicy.Moved(f.policy, now.policy, netpolicy.TCP, f.dst.Addr(), s.hard.Load()) {
			return false
		}
		f.policy, f.policyRevision = now.policy, now.revision
		// An update of its Egress came while it dialed through the old
		// revision: it drains as Apply would have made it, or closes.
		if e := now.egresses[f.decision.EgressID]; f.decision.Action == netpolicy.Forward && e != nil && e.revision != f.egressRevision {
			f.egressDraining = true
			if f.startDrain(e.drain, func() { s.cutFlow(f) }) {
				return false
			}
		}
	}
	s.conns[f] = struct{}{}
	return true
}

// CloseEgresses closes at once every connection, and every DNS stream,
// that goes through one of the Egresses deleted: DeleteEgress closes the
// connections still draining through it (no policy in force references a
// deleted Egress).
func (s *Slot) CloseEgresses(deleted map[string]bool) {
	if len(deleted) == 0 {
		return
	}
	var closeNow []*flow
	s.mu.Lock()
	for f := range s.conns {
		if f.decision.Action == netpolicy.Forward && deleted[f.decision.EgressID] {
			closeNow = append(closeNow, f)
		}
	}
	for st := range s.dnsStreams {
		if st.throughEgress(deleted) {
			st.close()
		}
	}
	s.mu.Unlock()
	for _, f := range closeNow {
		s.cutFlow(f)
	}
}

// closeFlow ends a flow whose directions have both ended, and forgets it.
func (s *Slot) closeFlow(f *flow) { s.endFlow(f, (*flow).close) }

// cutFlow cuts a flow short (flow.cut) and forgets it.
func (s *Slot) cutFlow(f *flow) { s.endFlow(f, (*flow).cut) }

// endFlow forgets a flow and ends it with end. It is forgotten first, so
// that once either side sees the end, no report counts it draining any
// more.
func (s *Slot) endFlow(f *flow, end func(*flow)) {
	s.mu.Lock()
	_, ok := s.conns[f]
	delete(s.conns, f)
	draining := f.stopDrain()
	s.mu.Unlock()
	end(f)
	if ok && draining {
		s.changed() // a draining revision may have ended
	}
}

// splice copies both ways between the guest's connection and the
// outbound one until both directions end, passing half-closes on: a side
// that ends its sending still gets what the other sends until that ends.
func splice(guest, out halfCloser) {
	var wg sync.WaitGroup
	wg.Go(func() {
		growStack()
		copyHalf(guest, out, &guestBuffers)
	})
	copyHalf(out, guest, &hostBuffers)
	wg.Wait()
}

// The copy buffers. A connection starts with a small one and moves to a
// large one once a read fills the small one, so a short exchange costs
// little memory. Toward the guest the large one is 256 KiB, whose reads fill
// the link's 64 KiB segments (32 KiB reads would halve them); toward the
// host 32 KiB, as larger reads there cost more CPU per byte.
var (
	smallBuffers = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}
	guestBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}
	hostBuffers  = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
)

// copyHalf copies src to dst, moving to the buffers of large once a read
// fills a small one, and then half-closes dst. A stream cut short is passed
// on as cut: when src ends otherwise than at its end (a reset), dst is
// reset, and when dst refuses what src sent, src is.
func copyHalf(dst halfCloser, src net.Conn, large *sync.Pool) {
	pool := &smallBuffers
	buf := pool.Get().(*[]byte)
	defer func() { pool.Put(buf) }()
	for {
		n, err := src.Read(*buf)
		if n > 0 {
			if _, werr := dst.Write((*buf)[:n]); werr != nil {
				abort(src)
				return
			}
			if n == len(*buf) && pool == &smallBuffers {
				pool.Put(buf)
				pool = large
				buf = pool.Get().(*[]byte)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			abort(dst)
			return
		}
	}
	dst.CloseWrite()
}

func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip
}
