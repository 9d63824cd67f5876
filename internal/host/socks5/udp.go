package socks5

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/netcheck"
)

// associate opens the UDP socket to the relay the endpoint answered in bound
// and returns the association over ctrl.
func (d *Dialer) associate(ctx context.Context, ctrl net.Conn, endpointIP netip.Addr, bound, dest addr) (net.Conn, error) {
	relay, err := d.relayAddr(ctx, endpointIP, bound)
	if err != nil {
		return nil, err
	}
	var dialer net.Dialer
	pc, err := dialer.DialContext(ctx, "udp", relay.String())
	if err != nil {
		if ctx.Err() != nil {
			return nil, gaveUp(ctx)
		}
		return nil, d.udpFailed("relay %s: %w", relay, err)
	}
	c := &udpConn{
		endpoint: d.Endpoint.Address,
		ctrl:     ctrl,
		relay:    pc,
		dest:     dest,
		// RSV, FRAG 0 (no fragmentation), then the destination.
		header: dest.appendTo([]byte{0, 0, 0}),
		buf:    make([]byte, 1<<16),
	}
	go c.watch()
	return c, nil
}

func (d *Dialer) udpFailed(format string, args ...any) error {
	return &Error{Kind: UDPAssociationFailed, Err: fmt.Errorf("endpoint %s: "+format, append([]any{d.Endpoint.Address}, args...)...)}
}

// relayAddr turns the address in the reply to UDP ASSOCIATE into the one to
// send to, and runs the dial check on it.
func (d *Dialer) relayAddr(ctx context.Context, endpointIP netip.Addr, bound addr) (netip.AddrPort, error) {
	if bound.port == 0 {
		return netip.AddrPort{}, d.udpFailed("answered the relay address %s, which has port 0", bound)
	}
	ips := []netip.Addr{bound.ip}
	switch {
	case bound.host != "":
		rctx, cancel := context.WithTimeout(ctx, d.connectTimeout())
		defer cancel()
		var err error
		if ips, err = netcheck.Resolve(rctx, d.Resolver, bound.host); err != nil {
			if ctx.Err() != nil {
				return netip.AddrPort{}, gaveUp(ctx)
			}
			return netip.AddrPort{}, d.udpFailed("relay: %w", err)
		}
	case bound.ip.IsUnspecified():
		// 0.0.0.0 or :: stands for the endpoint's own address.
		ips = []netip.Addr{endpointIP}
	}
	admitted, err := netcheck.Admit(ips, d.Check)
	if err != nil {
		return netip.AddrPort{}, d.udpFailed("the dial check removed the relay address: %w", errors.Unwrap(err))
	}
	return netip.AddrPortFrom(admitted[0], bound.port), nil
}

// udpConn is a UDP association: datagrams to and from one destination
// through the relay, alive while the control connection is.
type udpConn struct {
	endpoint string
	ctrl     net.Conn
	relay    net.Conn
	dest     addr
	header   []byte

	closing   atomic.Bool // Close was called
	ended     atomic.Bool // the control connection ended
	closeOnce sync.Once
	closeErr  error

	readMu sync.Mutex // guards buf
	buf    []byte
}

// watch waits for the control connection to end, which ends the
// association (RFC 1928 section 7), and then unblocks Read and Write.
func (c *udpConn) watch() {
	_, _ = io.Copy(io.Discard, c.ctrl)
	c.ended.Store(true)
	c.relay.Close()
}

// Read returns the payload of the next datagram from the destination,
// truncated to len(b) as a UDP read is. Datagrams that are malformed,
// fragmented or, for an IP literal destination, from another address are
// dropped.
func (c *udpConn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		n, err := c.relay.Read(c.buf)
		if err != nil {
			return 0, c.classify(err)
		}
		from, payload, ok := parseDatagram(c.buf[:n])
		if !ok || (c.dest.ip.IsValid() && (from.ip.Unmap() != c.dest.ip.Unmap() || from.port != c.dest.port)) {
			continue
		}
		return copy(b, payload), nil
	}
}

// Write sends b as one datagram to the destination.
func (c *udpConn) Write(b []byte) (int, error) {
	p := make([]byte, 0, len(c.header)+len(b))
	if _, err := c.relay.Write(append(append(p, c.header...), b...)); err != nil {
		return 0, c.classify(err)
	}
	return len(b), nil
}

func (c *udpConn) classify(err error) error {
	switch {
	case c.closing.Load():
		return err
	case c.ended.Load():
		return ErrAssociationEnded
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return &Error{Kind: UDPAssociationFailed, Err: fmt.Errorf("endpoint %s: relay %s: %w", c.endpoint, c.relay.RemoteAddr(), err)}
	}
	return err
}

// Close ends the association by closing the control connection and the
// UDP socket.
func (c *udpConn) Close() error {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		err := c.relay.Close()
		if errors.Is(err, net.ErrClosed) {
			err = nil // watch closed it when the control connection ended
		}
		c.closeErr = errors.Join(err, c.ctrl.Close())
	})
	return c.closeErr
}

func (c *udpConn) LocalAddr() net.Addr                { return c.relay.LocalAddr() }
func (c *udpConn) RemoteAddr() net.Addr               { return udpAddr(c.dest.String()) }
func (c *udpConn) SetDeadline(t time.Time) error      { return c.relay.SetDeadline(t) }
func (c *udpConn) SetReadDeadline(t time.Time) error  { return c.relay.SetReadDeadline(t) }
func (c *udpConn) SetWriteDeadline(t time.Time) error { return c.relay.SetWriteDeadline(t) }

// udpAddr is a UDP destination as host:port, where host may be a hostname.
type udpAddr string

func (a udpAddr) Network() string { return "udp" }
func (a udpAddr) String() string  { return string(a) }
