package netslot

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// FuzzLinkGuard feeds the guard what a guest may put on its link: every
// echo request parseEcho accepts is one sortPacket takes off the link (the
// stack would answer it for any address), and the packets built in answer
// to it or to a UDP datagram are valid.
func FuzzLinkGuard(f *testing.F) {
	// An IPv4 echo request to 203.0.113.9, an IPv6 one to 2001:db8::9, an
	// IPv4 fragment of one, a TCP SYN, and DNS queries to the link DNS
	// address, 10.211.0.1 and fe80::1 port 53.
	f.Add([]byte("\x45\x00\x00\x24\x00\x01\x00\x00\x40\x01\x00\x00\x0a\xd3\x00\x02\xcb\x00\x71\x09" +
		"\x08\x00\x00\x00\x00\x4e\x00\x01kibotos\x00\x00\x00\x00\x00"))
	f.Add([]byte("\x60\x00\x00\x00\x00\x0f\x3a\x40\xfd\x6b\x69\x62\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02" +
		"\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x09\x80\x00\x00\x00\x00\x4f\x00\x01kibotos"))
	f.Add([]byte("\x45\x00\x00\x2c\x10\x92\x20\x00\x40\x01\x00\x00\x0a\xd3\x00\x02\xcb\x00\x71\x09" +
		"\x08\x00\x00\x00\x00\x4e\x00\x01kibotos\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte("\x45\x00\x00\x28\x00\x01\x40\x00\x40\x06\x00\x00\x0a\xd3\x00\x02\xcb\x00\x71\x09" +
		"\x9c\x40\x00\x50\x00\x00\x00\x01\x00\x00\x00\x00\x50\x02\xff\xff\x00\x00\x00\x00"))
	query, _ := new(dns.Msg).SetQuestion("example.com.", dns.TypeA).Pack()
	guest4, guest6 := netip.MustParseAddrPort("10.211.0.2:40000"), netip.MustParseAddrPort("[fe80::2]:40000")
	f.Add(udpPacket(guest4, netip.AddrPortFrom(addr(GatewayIPv4), dnsPort), query))
	f.Add(udpPacket(guest6, netip.AddrPortFrom(addr(GatewayIPv6), dnsPort), query))
	f.Fuzz(func(t *testing.T, b []byte) {
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
		sorted := sortPacket(pkt.Data())
		pkt.DecRef()
		if req, ok := parseEcho(b); ok {
			if sorted != echoPacket {
				t.Fatalf("parseEcho accepts % x, which sortPacket passes on as %d", b, sorted)
			}
			for _, p := range [][]byte{prohibited(req), echoReply(req, req.data)} {
				if p != nil && !validPacket(p) {
					t.Fatalf("the answer % x to % x is not a valid packet", p, b)
				}
			}
		}
		from, to, q, ok := parseDatagram(b)
		if !ok {
			return
		}
		if isLinkDNS(to.Addr()) && to.Port() == dnsPort && sorted != dnsPacket {
			t.Fatalf("sortPacket passes on % x, a datagram to a link DNS address, as %d", b, sorted)
		}
		answer := udpPacket(to, from, q)
		if !validPacket(answer) {
			t.Fatalf("the answer % x to % x is not a valid packet", answer, b)
		}
		if back, fwd, p, ok := parseDatagram(answer); !ok || back != to || fwd != from || !bytes.Equal(p, q) {
			t.Fatalf("the answer to % x reads as %s → %s % x (%v)", b, back, fwd, p, ok)
		}
	})
}

// validPacket says whether p is a valid IPv4 or IPv6 packet whose UDP or
// ICMP checksum, if it has one, is right.
func validPacket(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	var src, dst tcpip.Address
	var proto tcpip.TransportProtocolNumber
	var body []byte
	switch p[0] >> 4 {
	case 4:
		ip := header.IPv4(p)
		if !ip.IsValid(len(p)) || !ip.IsChecksumValid() {
			return false
		}
		src, dst, proto, body = ip.SourceAddress(), ip.DestinationAddress(), ip.TransportProtocol(), ip.Payload()
	case 6:
		ip := header.IPv6(p)
		if !ip.IsValid(len(p)) {
			return false
		}
		src, dst, proto, body = ip.SourceAddress(), ip.DestinationAddress(), ip.TransportProtocol(), ip.Payload()
	default:
		return false
	}
	switch proto {
	case header.UDPProtocolNumber:
		return header.UDP(body).IsChecksumValid(src, dst, checksum.Checksum(body[header.UDPMinimumSize:], 0))
	case header.ICMPv4ProtocolNumber:
		return checksum.Checksum(body, 0) == 0xffff
	case header.ICMPv6ProtocolNumber:
		return checksum.Checksum(body, header.PseudoHeaderChecksum(proto, src, dst, uint16(len(body)))) == 0xffff
	}
	return true
}
