package netslot

import (
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// FuzzEchoGuard feeds the guard what a guest may put on its link: every
// echo request parseEcho accepts is one sortPacket takes off the link (the
// stack would answer it for any address), and the packets built in answer
// to it are valid.
func FuzzEchoGuard(f *testing.F) {
	// An IPv4 echo request to 203.0.113.9, an IPv6 one to 2001:db8::9, an
	// IPv4 fragment of one, and a TCP SYN.
	f.Add([]byte("\x45\x00\x00\x24\x00\x01\x00\x00\x40\x01\x00\x00\x0a\xd3\x00\x02\xcb\x00\x71\x09" +
		"\x08\x00\x00\x00\x00\x4e\x00\x01kibotos\x00\x00\x00\x00\x00"))
	f.Add([]byte("\x60\x00\x00\x00\x00\x0f\x3a\x40\xfd\x6b\x69\x62\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02" +
		"\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x09\x80\x00\x00\x00\x00\x4f\x00\x01kibotos"))
	f.Add([]byte("\x45\x00\x00\x2c\x10\x92\x20\x00\x40\x01\x00\x00\x0a\xd3\x00\x02\xcb\x00\x71\x09" +
		"\x08\x00\x00\x00\x00\x4e\x00\x01kibotos\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte("\x45\x00\x00\x28\x00\x01\x40\x00\x40\x06\x00\x00\x0a\xd3\x00\x02\xcb\x00\x71\x09" +
		"\x9c\x40\x00\x50\x00\x00\x00\x01\x00\x00\x00\x00\x50\x02\xff\xff\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
		sorted := sortPacket(pkt.Data())
		pkt.DecRef()
		req, ok := parseEcho(b)
		if !ok {
			return
		}
		if sorted != echoPacket {
			t.Fatalf("parseEcho accepts % x, which sortPacket passes on as %d", b, sorted)
		}
		for _, p := range [][]byte{prohibited(req), echoReply(req, req.data)} {
			if p == nil {
				continue
			}
			if valid := req.dst.Is4() && header.IPv4(p).IsValid(len(p)) || req.dst.Is6() && header.IPv6(p).IsValid(len(p)); !valid {
				t.Fatalf("the answer % x to % x is not a valid packet", p, b)
			}
		}
	})
}
