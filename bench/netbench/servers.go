package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// startProxy starts a SOCKS5 server on the test host and points sb at it;
// stop closes it once its connections have ended.
func (b *bench) startProxy(sb *sandbox) (stop func(), err error) {
	l, err := inTestHost(b.inet, func() (net.Listener, error) {
		return net.Listen("tcp4", net.JoinHostPort(nettest.HostIPv4.String(), "0"))
	})
	if err != nil {
		return nil, fmt.Errorf("test host SOCKS5 server: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { serveSOCKS5(l) })
	stop = func() {
		l.Close()
		wg.Wait()
	}
	if err := sb.viaProxy(l.Addr().(*net.TCPAddr).AddrPort()); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// serveSOCKS5 is a SOCKS5 server (RFC 1928: no authentication, CONNECT to
// an IP address) for the Egress row: it serves l until l closes and
// returns once its connections have ended.
func serveSOCKS5(l net.Listener) {
	serveEach(l, func(c net.Conn) {
		out, err := socks5Connect(c)
		if err != nil {
			return
		}
		defer out.Close()
		var pipes sync.WaitGroup
		pipes.Go(func() { pipe(c.(*net.TCPConn), out) })
		pipe(out, c.(*net.TCPConn))
		pipes.Wait()
	})
}

// serveEach runs handle on each connection l accepts, in its own goroutine,
// and closes the connection after it; it returns once l closed and every
// handle ended.
func serveEach(l net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer c.Close()
			handle(c)
		})
	}
}

// socks5Connect reads the client's greeting and CONNECT request, dials its
// destination and answers.
func socks5Connect(c net.Conn) (*net.TCPConn, error) {
	var head [2]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return nil, err
	}
	methods := make([]byte, head[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{5, 0}); err != nil {
		return nil, err
	}
	var req [4]byte
	if _, err := io.ReadFull(c, req[:]); err != nil {
		return nil, err
	}
	var ip []byte
	switch req[3] {
	case 1:
		ip = make([]byte, 4)
	case 4:
		ip = make([]byte, 16)
	default:
		c.Write([]byte{5, 8, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, errors.New("address type not supported")
	}
	var port [2]byte
	if _, err := io.ReadFull(c, ip); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(c, port[:]); err != nil {
		return nil, err
	}
	a, _ := netip.AddrFromSlice(ip)
	out, err := net.Dial("tcp", netip.AddrPortFrom(a, binary.BigEndian.Uint16(port[:])).String())
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, err
	}
	bound := out.LocalAddr().(*net.TCPAddr)
	reply := append([]byte{5, 0, 0, 1}, bound.IP.To4()...)
	reply = binary.BigEndian.AppendUint16(reply, uint16(bound.Port))
	if _, err := c.Write(reply); err != nil {
		out.Close()
		return nil, err
	}
	return out.(*net.TCPConn), nil
}

// pipe copies src to dst, then half-closes dst.
func pipe(dst, src *net.TCPConn) {
	io.Copy(dst, src)
	dst.CloseWrite()
}

// serveDNS answers every A query on pc with one address from memory, as a
// resolver answers from its cache, until pc closes.
func serveDNS(pc net.PacketConn) {
	buf := make([]byte, dns.MaxMsgSize)
	rr := &dns.A{Hdr: dns.RR_Header{Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IPv4(192, 0, 2, 1)}
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:n]) != nil || len(q.Question) != 1 {
			continue
		}
		m := new(dns.Msg).SetReply(q)
		a := *rr
		a.Hdr.Name = q.Question[0].Name
		m.Answer = []dns.RR{&a}
		if out, err := m.Pack(); err == nil {
			pc.WriteTo(out, from)
		}
	}
}
