package netslot

import (
	"context"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/kibotos/kibotos/internal/host/netpolicy"
)

const (
	// echoTimeout bounds the wait for the destination's echo reply.
	echoTimeout = 5 * time.Second
	// maxEchoesInFlight bounds the echo requests being forwarded at once.
	maxEchoesInFlight = 64
	hopLimit          = 64
	// ipv6MinMTU bounds an ICMPv6 error message (RFC 4443 §2.4).
	ipv6MinMTU = 1280
)

// echo is one echo request of the guest.
type echo struct {
	src, dst netip.Addr
	id, seq  uint16
	data     []byte
	packet   []byte // the whole request, for an error message quoting it
}

// parseEcho recognizes an unfragmented ICMP or ICMPv6 echo request.
func parseEcho(b []byte) (echo, bool) {
	if len(b) == 0 {
		return echo{}, false
	}
	switch b[0] >> 4 {
	case 4:
		ip := header.IPv4(b)
		if !ip.IsValid(len(b)) || ip.TransportProtocol() != header.ICMPv4ProtocolNumber || ip.More() || ip.FragmentOffset() != 0 {
			return echo{}, false
		}
		m := header.ICMPv4(ip.Payload())
		if len(m) < header.ICMPv4MinimumSize || m.Type() != header.ICMPv4Echo {
			return echo{}, false
		}
		return echo{src: addrOf(ip.SourceAddress()), dst: addrOf(ip.DestinationAddress()), id: m.Ident(), seq: m.Sequence(),
			data: append([]byte(nil), m.Payload()...), packet: append([]byte(nil), b...)}, true
	case 6:
		ip := header.IPv6(b)
		if !ip.IsValid(len(b)) || ip.TransportProtocol() != header.ICMPv6ProtocolNumber {
			return echo{}, false
		}
		m := header.ICMPv6(ip.Payload())
		if len(m) < header.ICMPv6EchoMinimumSize || m.Type() != header.ICMPv6EchoRequest {
			return echo{}, false
		}
		return echo{src: addrOf(ip.SourceAddress()), dst: addrOf(ip.DestinationAddress()), id: m.Ident(), seq: m.Sequence(),
			data: append([]byte(nil), m.MessageBody()[4:]...), packet: append([]byte(nil), b...)}, true
	}
	return echo{}, false
}

// takeEcho decides the echo request in packet (handleEcho); false when
// packet is not one.
func (s *Slot) takeEcho(packet []byte) bool {
	req, ok := parseEcho(packet)
	if ok {
		s.handleEcho(req)
	}
	return ok
}

// handleEcho decides an echo request: forwarded from the host when it may
// leave directly, answered at once with administratively prohibited when
// an Egress covers its destination, dropped otherwise.
func (s *Slot) handleEcho(req echo) {
	a := s.current()
	d := netpolicy.Decision{Action: netpolicy.Refuse}
	if a != nil {
		d = a.policy.Decide(netpolicy.ICMPEcho, req.dst, s.hard.Load())
	}
	switch d.Action {
	case netpolicy.Prohibit:
		s.inject(prohibited(req))
	case netpolicy.Direct:
		select {
		case s.echoes <- struct{}{}:
			s.wg.Go(func() {
				defer func() { <-s.echoes }()
				s.forwardEcho(req)
			})
		default: // too many in flight: dropped, as a busy router would
		}
	}
}

// forwardEcho sends the request from the host and relays the reply; a
// request to an address of the host is dropped.
func (s *Slot) forwardEcho(req echo) {
	if checkNotHost(req.dst) != nil {
		return
	}
	network, proto := "ip4:icmp", 1
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if req.dst.Is6() {
		network, proto, typ = "ip6:ipv6-icmp", 58, ipv6.ICMPTypeEchoRequest
	}
	c, err := icmp.ListenPacket(network, "")
	if err != nil {
		return
	}
	defer c.Close()
	stop := context.AfterFunc(s.ctx, func() { c.Close() })
	defer stop()
	msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: int(req.id), Seq: int(req.seq), Data: req.data}}
	b, err := msg.Marshal(nil) // the kernel sums ICMPv6
	if err != nil {
		return
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: req.dst.AsSlice()}); err != nil {
		return
	}
	c.SetReadDeadline(time.Now().Add(echoTimeout))
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		if ip, ok := netip.AddrFromSlice(from.(*net.IPAddr).IP); !ok || ip.Unmap() != req.dst.Unmap() {
			continue
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); ok && (m.Type == ipv4.ICMPTypeEchoReply || m.Type == ipv6.ICMPTypeEchoReply) &&
			e.ID == int(req.id) && e.Seq == int(req.seq) {
			s.inject(echoReply(req, e.Data))
			return
		}
	}
}

// inject hands the guest a packet through its TUN device.
func (s *Slot) inject(packet []byte) {
	if packet != nil {
		s.link.inject(packet)
	}
}

// echoReply is the reply the guest receives from its destination.
func echoReply(req echo, data []byte) []byte {
	var typ icmp.Type = ipv4.ICMPTypeEchoReply
	if req.dst.Is6() {
		typ = ipv6.ICMPTypeEchoReply
	}
	return icmpPacket(req.dst, req.src, icmp.Message{Type: typ, Body: &icmp.Echo{ID: int(req.id), Seq: int(req.seq), Data: data}})
}

// prohibited is the slot's "communication administratively prohibited"
// answer to a request, quoting it as much as the rules allow.
func prohibited(req echo) []byte {
	if req.dst.Is4() {
		quote := req.packet[:min(len(req.packet), int(header.IPv4(req.packet).HeaderLength())+8)]
		return icmpPacket(addr(GatewayIPv4), req.src, icmp.Message{Type: ipv4.ICMPTypeDestinationUnreachable,
			Code: int(header.ICMPv4AdminProhibited), Body: &icmp.DstUnreach{Data: quote}})
	}
	quote := req.packet[:min(len(req.packet), ipv6MinMTU-header.IPv6MinimumSize-header.ICMPv6DstUnreachableMinimumSize)]
	return icmpPacket(addr(GatewayIPv6), req.src, icmp.Message{Type: ipv6.ICMPTypeDestinationUnreachable,
		Code: int(header.ICMPv6Prohibited), Body: &icmp.DstUnreach{Data: quote}})
}

// icmpPacket is m from src to dst in its IP packet.
func icmpPacket(src, dst netip.Addr, m icmp.Message) []byte {
	proto, pseudoHeader := header.ICMPv4ProtocolNumber, []byte(nil)
	if src.Is6() {
		proto, pseudoHeader = header.ICMPv6ProtocolNumber, icmp.IPv6PseudoHeader(src.AsSlice(), dst.AsSlice())
	}
	body, err := m.Marshal(pseudoHeader)
	if err != nil {
		return nil
	}
	return ipPacket(src, dst, proto, body)
}
