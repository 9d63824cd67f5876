package netslot

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// linkGuard sits between the TUN link and the stack. It takes the guest's
// ICMP echo requests for the policy to decide: left to the stack, which
// accepts every destination, they would be answered for any address. It
// answers at once, on the link's own goroutine, the UDP queries to the
// link DNS address that need no exchange (quickAnswer); through the stack,
// each would cross two goroutines and a socket of its own. And it ends the
// TIME_WAIT of a connection whose ports a new SYN of the guest's reuses
// (endTimeWait).
type linkGuard struct {
	nested.Endpoint
	slot *Slot
}

func newLinkGuard(s *Slot, link stack.LinkEndpoint) *linkGuard {
	g := &linkGuard{slot: s}
	g.Init(link, g)
	return g
}

// DeliverNetworkPacket implements stack.NetworkDispatcher.
func (g *linkGuard) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	sort := sortPacket(pkt.Data())
	switch sort {
	case dropPacket:
		return
	case passPacket:
		g.Endpoint.DeliverNetworkPacket(proto, pkt)
		return
	}
	if sort == synPacket {
		g.endTimeWait(proto, pkt.Data())
		g.Endpoint.DeliverNetworkPacket(proto, pkt)
		return
	}
	// The link's packet processors outlive its detaching for a moment, so
	// this may run while the slot closes: only an open slot answers, and
	// Close waits for it before closing the TUN device that answers are
	// written to.
	if !g.slot.enter() {
		return
	}
	defer g.slot.wg.Done()
	v := pkt.ToView()
	defer v.Release()
	taken := false
	switch sort {
	case echoPacket:
		taken = g.slot.takeEcho(v.AsSlice())
	case dnsPacket:
		taken = g.slot.answerDatagram(v.AsSlice())
	}
	if !taken {
		g.Endpoint.DeliverNetworkPacket(proto, pkt)
	}
}

// packetSort is what the guard does with a packet of the guest.
type packetSort int

const (
	passPacket packetSort = iota // to the stack
	echoPacket                   // an echo request, for the policy
	dnsPacket                    // a UDP datagram to a link DNS address's port 53
	synPacket                    // a TCP SYN without ACK: the guest opens a connection
	// dropPacket: what could hide an echo request from the guard. The
	// stack would reassemble a fragmented one, or find one behind IPv6
	// extension headers, and answer it for any address.
	dropPacket
)

// sortPacket looks at no more than the headers, so that the guest's other
// packets pass without a copy.
func sortPacket(d stack.PacketData) packetSort {
	b, ok := d.PullUp(1)
	if !ok {
		return passPacket
	}
	switch b[0] >> 4 {
	case 4:
		if b, ok = d.PullUp(header.IPv4MinimumSize); !ok {
			return passPacket
		}
		ip := header.IPv4(b)
		fragment := ip.More() || ip.FragmentOffset() != 0
		n := int(b[0]&0xf) * 4
		switch ip.TransportProtocol() {
		case header.ICMPv4ProtocolNumber:
			if fragment {
				return dropPacket
			}
			if b, ok = d.PullUp(n + 1); ok && b[n] == uint8(header.ICMPv4Echo) {
				return echoPacket
			}
		case header.TCPProtocolNumber:
			if b, ok = d.PullUp(n + header.TCPMinimumSize); ok && !fragment && isSYN(header.TCP(b[n:])) {
				return synPacket
			}
		case header.UDPProtocolNumber:
			if !fragment && netip.AddrFrom4([4]byte(b[16:20])) == linkDNS4 {
				if b, ok = d.PullUp(n + 4); ok && header.UDP(b[n:]).DestinationPort() == dnsPort {
					return dnsPacket
				}
			}
		}
	case 6:
		if b, ok = d.PullUp(header.IPv6MinimumSize + 1); !ok {
			return passPacket
		}
		switch tcpip.TransportProtocolNumber(b[6]) {
		case header.ICMPv6ProtocolNumber:
			if b[header.IPv6MinimumSize] == uint8(header.ICMPv6EchoRequest) {
				return echoPacket
			}
		case header.UDPProtocolNumber:
			if netip.AddrFrom16([16]byte(b[24:40])) == linkDNS6 {
				if b, ok = d.PullUp(header.IPv6MinimumSize + 4); ok && header.UDP(b[header.IPv6MinimumSize:]).DestinationPort() == dnsPort {
					return dnsPacket
				}
			}
		case header.TCPProtocolNumber:
			if b, ok = d.PullUp(header.IPv6MinimumSize + header.TCPMinimumSize); ok && isSYN(header.TCP(b[header.IPv6MinimumSize:])) {
				return synPacket
			}
		default:
			return dropPacket
		}
	}
	return passPacket
}

// isSYN reports whether a TCP segment opens a connection.
func isSYN(h header.TCP) bool {
	return h.Flags()&(header.TCPFlagSyn|header.TCPFlagAck) == header.TCPFlagSyn
}

// endTimeWait closes the stack's endpoint of an earlier connection with
// the same addresses and ports as the SYN in d, when that endpoint is in
// TIME_WAIT. The stack's TIME_WAIT lasts no time (see setUp), but it ends on
// a timer's goroutine: a SYN arriving just before would be dropped, or
// answered with a reset when the endpoint closes with it still queued,
// since the stack hands such a SYN only to a listener, never to the
// forwarder. Closed here, before the SYN reaches the stack, the endpoint
// is gone and the forwarder takes the SYN. The closing sends the old
// connection a reset, which the guest's new connection ignores: it does
// not acknowledge the new SYN (RFC 793, SYN-SENT).
func (g *linkGuard) endTimeWait(proto tcpip.NetworkProtocolNumber, d stack.PacketData) {
	id, ok := synConnectionID(d)
	if !ok || !g.slot.enter() {
		return
	}
	defer g.slot.wg.Done()
	if ep, ok := g.slot.stack.FindTransportEndpoint(proto, tcp.ProtocolNumber, id, nicID).(*tcp.Endpoint); ok && ep.EndpointState() == tcp.StateTimeWait {
		ep.Abort()
	}
}

// synConnectionID is the stack's identity of the connection a guest's SYN
// opens (local is the destination), read from the headers sortPacket
// found, without a copy.
func synConnectionID(d stack.PacketData) (stack.TransportEndpointID, bool) {
	b, ok := d.PullUp(1)
	if !ok {
		return stack.TransportEndpointID{}, false
	}
	var src, dst tcpip.Address
	var t header.TCP
	switch b[0] >> 4 {
	case 4:
		n := int(b[0]&0xf) * 4
		if b, ok = d.PullUp(n + header.TCPMinimumSize); !ok {
			return stack.TransportEndpointID{}, false
		}
		ip := header.IPv4(b)
		src, dst, t = ip.SourceAddress(), ip.DestinationAddress(), header.TCP(b[n:])
	case 6:
		if b, ok = d.PullUp(header.IPv6MinimumSize + header.TCPMinimumSize); !ok {
			return stack.TransportEndpointID{}, false
		}
		ip := header.IPv6(b)
		src, dst, t = ip.SourceAddress(), ip.DestinationAddress(), header.TCP(b[header.IPv6MinimumSize:])
	default:
		return stack.TransportEndpointID{}, false
	}
	return stack.TransportEndpointID{
		LocalPort: t.DestinationPort(), LocalAddress: dst,
		RemotePort: t.SourcePort(), RemoteAddress: src,
	}, true
}

// parseDatagram reads an unfragmented UDP datagram in an IPv4 or IPv6
// packet without extension headers.
func parseDatagram(b []byte) (from, to netip.AddrPort, payload []byte, ok bool) {
	if len(b) == 0 {
		return
	}
	var src, dst tcpip.Address
	var seg []byte
	switch b[0] >> 4 {
	case 4:
		ip := header.IPv4(b)
		if !ip.IsValid(len(b)) || ip.TransportProtocol() != header.UDPProtocolNumber || ip.More() || ip.FragmentOffset() != 0 {
			return
		}
		src, dst, seg = ip.SourceAddress(), ip.DestinationAddress(), ip.Payload()
	case 6:
		ip := header.IPv6(b)
		if !ip.IsValid(len(b)) || ip.TransportProtocol() != header.UDPProtocolNumber {
			return
		}
		src, dst, seg = ip.SourceAddress(), ip.DestinationAddress(), ip.Payload()
	default:
		return
	}
	u := header.UDP(seg)
	if len(u) < header.UDPMinimumSize || int(u.Length()) < header.UDPMinimumSize || int(u.Length()) > len(u) {
		return
	}
	return netip.AddrPortFrom(addrOf(src), u.SourcePort()), netip.AddrPortFrom(addrOf(dst), u.DestinationPort()),
		u[header.UDPMinimumSize:u.Length()], true
}

// udpPacket is payload in a UDP datagram from src to dst, in its IP
// packet.
func udpPacket(src, dst netip.AddrPort, payload []byte) []byte {
	seg := make([]byte, header.UDPMinimumSize+len(payload))
	u := header.UDP(seg)
	u.Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(seg))})
	copy(seg[header.UDPMinimumSize:], payload)
	sum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, tcpipAddr(src.Addr()), tcpipAddr(dst.Addr()), uint16(len(seg)))
	xsum := ^checksum.Checksum(seg, sum)
	if xsum == 0 {
		xsum = 0xffff // zero would say "no checksum" (RFC 768)
	}
	u.SetChecksum(xsum)
	return ipPacket(src.Addr(), dst.Addr(), header.UDPProtocolNumber, seg)
}

// ipPacket is body in an IP packet of proto from src to dst, both of one
// family.
func ipPacket(src, dst netip.Addr, proto tcpip.TransportProtocolNumber, body []byte) []byte {
	if src.Is4() {
		b := make([]byte, header.IPv4MinimumSize+len(body))
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), TTL: hopLimit, Protocol: uint8(proto),
			SrcAddr: tcpipAddr(src), DstAddr: tcpipAddr(dst)})
		ip.SetChecksum(^ip.CalculateChecksum())
		copy(b[header.IPv4MinimumSize:], body)
		return b
	}
	b := make([]byte, header.IPv6MinimumSize+len(body))
	header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: uint16(len(body)), TransportProtocol: proto,
		HopLimit: hopLimit, SrcAddr: tcpipAddr(src), DstAddr: tcpipAddr(dst)})
	copy(b[header.IPv6MinimumSize:], body)
	return b
}

// tcpipAddr is a in gVisor's form.
func tcpipAddr(a netip.Addr) tcpip.Address { return tcpip.AddrFromSlice(a.AsSlice()) }
