package socks5test

import (
	"bytes"
	"io"
	"net"
	"net/netip"
)

// associate serves UDP ASSOCIATE on control connection c: it opens a relay,
// answers its address and relays until c ends (RFC 1928 section 7).
func (s *Server) associate(c net.Conn, fault Fault) {
	if fault == RefuseUDP {
		reply(c, repNotSupported, netip.AddrPort{})
		return
	}
	ip := s.o.RelayIP
	if !ip.IsValid() {
		ip = s.ln.Addr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)))
	if err != nil {
		reply(c, repFailure, netip.AddrPort{})
		return
	}
	if !s.track(pc) {
		return
	}
	defer s.release(pc)
	bound := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	if fault == DeadRelay {
		// The port stays unused for a while, so datagrams sent to it get a
		// port unreachable.
		pc.Close()
	} else {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.relay(pc)
		}()
	}
	if s.o.UnspecifiedRelay {
		unspecified := netip.IPv6Unspecified()
		if ip.Is4() {
			unspecified = netip.IPv4Unspecified()
		}
		bound = netip.AddrPortFrom(unspecified, bound.Port())
	}
	if reply(c, repSuccess, bound) != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

// relay forwards datagrams until pc is closed. The first sender is the
// client: its datagrams carry a SOCKS header naming the target; datagrams
// from anyone else go back to the client with a header naming the sender.
func (s *Server) relay(pc *net.UDPConn) {
	buf := make([]byte, 1<<16)
	var client netip.AddrPort
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		if !client.IsValid() {
			client = from
		}
		if from != client {
			out := appendAddr([]byte{0, 0, 0}, from)
			_, _ = pc.WriteToUDPAddrPort(append(out, buf[:n]...), client)
			continue
		}
		// RSV (2 bytes), FRAG; fragments are dropped.
		if n < 4 || buf[2] != 0 {
			continue
		}
		r := bytes.NewReader(buf[3:n])
		target, err := readTarget(r)
		if err != nil {
			continue
		}
		to, err := net.ResolveUDPAddr("udp", target)
		if err != nil {
			continue
		}
		if _, err := pc.WriteToUDP(buf[n-r.Len():n], to); err == nil {
			s.mu.Lock()
			s.datagrams++
			s.mu.Unlock()
		}
	}
}
