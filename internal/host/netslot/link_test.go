package netslot

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// packetQueue returns a stand-in for a TUN queue, one end of a
// SOCK_SEQPACKET pair (each read and write is one packet, as on the
// device), and the other end's descriptor, which plays the guest.
func packetQueue(t *testing.T, nonblocking bool) (*os.File, int) {
	t.Helper()
	typ := unix.SOCK_SEQPACKET | unix.SOCK_CLOEXEC
	if nonblocking {
		typ |= unix.SOCK_NONBLOCK
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, typ, 0)
	if err != nil {
		t.Fatal(err)
	}
	guest := fds[1]
	if err := unix.SetNonblock(guest, false); err != nil {
		t.Fatal(err)
	}
	// A read of the guest's that nothing answers fails the test instead
	// of hanging it, and a write to a stopped link gives up.
	rcv, snd := unix.NsecToTimeval((10 * time.Second).Nanoseconds()), unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(guest, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &rcv); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptTimeval(guest, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &snd); err != nil {
		t.Fatal(err)
	}
	q := os.NewFile(uintptr(fds[0]), "queue")
	t.Cleanup(func() {
		q.Close()
		unix.Close(guest)
	})
	return q, guest
}

// delivered is a packet the link handed to the stack.
type delivered struct {
	proto tcpip.NetworkProtocolNumber
	data  []byte
	held  int // bytes of the memory that holds it
}

// recorder is a stack.NetworkDispatcher that keeps what it is given.
type recorder struct{ packets chan delivered }

func (r *recorder) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	held := 0
	for _, b := range pkt.AsSlices() {
		held += cap(b) // to the end of its chunk
	}
	v := pkt.ToView()
	r.packets <- delivered{proto, v.ToSlice(), held}
	v.Release()
}

func (r *recorder) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

func (r *recorder) next(t *testing.T) delivered {
	t.Helper()
	select {
	case d := <-r.packets:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no packet delivered")
		return delivered{}
	}
}

// attached returns a link serving queue, attached to a recorder, and
// stopped when the test ends.
func attached(t *testing.T, queue *os.File) (*tunLink, *recorder) {
	t.Helper()
	l, err := newTUNLink([]*os.File{queue})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{packets: make(chan delivered, 16)}
	l.Attach(r)
	t.Cleanup(func() {
		l.stop()
		l.Wait()
	})
	return l, r
}

// versionPacket is a packet of length n whose first byte says IP version v.
func versionPacket(v byte, n int, fill byte) []byte {
	b := bytes.Repeat([]byte{fill}, n)
	b[0] = v << 4
	return b
}

// frame is packet as the device carries it, after the header h.
func frame(h vnetHdr, packet []byte) []byte {
	b := make([]byte, vnetHdrLen, vnetHdrLen+len(packet))
	h.encode(b)
	return append(b, packet...)
}

// partial is the header of a guest's packet whose checksum is left to the
// slot.
var partial = vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, csumStart: 20, csumOffset: 16}

// The guest's IPv4 and IPv6 packets reach the stack whole, without the
// device's header, small or as large as the MTU, their checksums complete
// or partial, with their protocol, each held in memory not much larger
// than itself; anything else is dropped, and so is a packet that claims a
// segmentation offload the device does not offer.
func TestLinkDeliversTheGuestsPackets(t *testing.T) {
	queue, guest := packetQueue(t, true)
	_, r := attached(t, queue)
	sent := []struct {
		hdr    vnetHdr
		packet []byte
		proto  tcpip.NetworkProtocolNumber
	}{
		{vnetHdr{}, versionPacket(4, 60, 'a'), header.IPv4ProtocolNumber},
		{partial, versionPacket(6, 80, 'b'), header.IPv6ProtocolNumber},
		{vnetHdr{}, versionPacket(0, 40, 'c'), 0}, // neither: dropped
		{partial, versionPacket(4, 16<<10+1, 'd'), header.IPv4ProtocolNumber},
		{vnetHdr{}, versionPacket(6, 17000, 'h'), header.IPv6ProtocolNumber},
		{vnetHdr{}, versionPacket(4, 33000, 'i'), header.IPv4ProtocolNumber},
		{vnetHdr{}, versionPacket(4, keepBuffer-1, 'j'), header.IPv4ProtocolNumber},
		{vnetHdr{}, versionPacket(4, keepBuffer, 'k'), header.IPv4ProtocolNumber},
		{vnetHdr{gsoType: unix.VIRTIO_NET_HDR_GSO_TCPV4, gsoSize: 1000}, versionPacket(4, 3000, 'g'), 0}, // dropped
		{vnetHdr{}, versionPacket(6, MTU, 'e'), header.IPv6ProtocolNumber},
		{vnetHdr{}, versionPacket(4, 40, 'f'), header.IPv4ProtocolNumber},
	}
	for _, s := range sent {
		if _, err := unix.Write(guest, frame(s.hdr, s.packet)); err != nil {
			t.Fatal(err)
		}
	}
	// Shorter than the header: dropped.
	if _, err := unix.Write(guest, []byte{0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	for _, s := range sent {
		if s.proto == 0 {
			continue
		}
		d := r.next(t)
		if d.proto != s.proto || !bytes.Equal(d.data, s.packet) {
			t.Fatalf("delivered %d bytes starting %q as protocol %d, want %d bytes starting %q as %d",
				len(d.data), d.data[1:2], d.proto, len(s.packet), s.packet[1:2], s.proto)
		}
		// The stack counts a packet's length against its connection's
		// buffer: the memory that holds it is at most a third more, or a
		// small packet's rounding up to 2 KiB.
		if limit := max(len(s.packet)*4/3, 2<<10); d.held > limit {
			t.Errorf("a packet of %d bytes holds %d bytes of memory, over %d", len(s.packet), d.held, limit)
		}
	}
}

// tcpPacket is a TCP segment with flags and payload after an IP header of
// l3 bytes (zeros: the link reads only its length), as the stack hands it
// to the link, with the link's header added as the NIC adds it.
func tcpPacket(l *tunLink, l3 int, gso stack.GSO, flags header.TCPFlags, payload string) *stack.PacketBuffer {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: vnetHdrLen + header.IPv6MinimumSize + header.TCPMinimumSize,
		Payload:            buffer.MakeWithData([]byte(payload)),
	})
	h := header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize))
	h.Encode(&header.TCPFields{SrcPort: 80, DstPort: 4000, Flags: flags, DataOffset: header.TCPMinimumSize})
	pkt.TransportProtocolNumber = header.TCPProtocolNumber
	pkt.NetworkHeader().Push(l3)
	pkt.GSOOptions = gso
	l.AddHeader(pkt)
	return pkt
}

// readFrame reads one packet the link wrote to the guest and splits it
// into the device's header and the IP packet.
func readFrame(t *testing.T, guest int) ([]byte, []byte) {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Read(guest, buf)
	if err != nil {
		t.Fatalf("the guest read: %v", err)
	}
	if n < vnetHdrLen {
		t.Fatalf("the guest read %d bytes, shorter than the device's header", n)
	}
	return buf[:vnetHdrLen], buf[vnetHdrLen:n]
}

// The stack's packets reach the guest after a header of zeros when their
// checksums are complete, a SYN-ACK (written apart) too, and Wait returns
// once every write is done.
func TestLinkWritesTheStacksPackets(t *testing.T) {
	queue, guest := packetQueue(t, true)
	l, _ := attached(t, queue)
	synAck := tcpPacket(l, header.IPv4MinimumSize, stack.GSO{}, header.TCPFlagSyn|header.TCPFlagAck, "")
	data := tcpPacket(l, header.IPv4MinimumSize, stack.GSO{}, header.TCPFlagAck|header.TCPFlagPsh, "answer")
	if !isSynAck(synAck) || isSynAck(data) {
		t.Fatalf("isSynAck: %v for a SYN-ACK and %v for data, want true and false", isSynAck(synAck), isSynAck(data))
	}
	var pkts stack.PacketBufferList
	pkts.PushBack(synAck)
	pkts.PushBack(data)
	if n, err := l.WritePackets(pkts); n != 2 || err != nil {
		t.Fatalf("WritePackets: %d, %v; want 2 written", n, err)
	}
	pkts.Reset() // the caller's references, as the stack drops them
	l.drains.Wait()
	got := map[header.TCPFlags]string{}
	for range 2 {
		hdr, packet := readFrame(t, guest)
		if !bytes.Equal(hdr, make([]byte, vnetHdrLen)) {
			t.Errorf("a packet with complete checksums came with the header %v, want zeros", hdr)
		}
		h := header.TCP(packet[header.IPv4MinimumSize:])
		got[h.Flags()] = string(h.Payload())
	}
	if s, ok := got[header.TCPFlagSyn|header.TCPFlagAck]; !ok || s != "" {
		t.Errorf("the guest got %v, no SYN-ACK", got)
	}
	if s := got[header.TCPFlagAck|header.TCPFlagPsh]; s != "answer" {
		t.Errorf("the guest got %v, not the data segment", got)
	}
}

// The packets of a flow reach the guest in the order the stack wrote them,
// whether written at once or apart: a packet that would go at once waits
// behind those already apart, and the drain writes them in order.
func TestLinkKeepsAFlowsOrder(t *testing.T) {
	queue, guest := packetQueue(t, true)
	l, _ := attached(t, queue)
	bulk := strings.Repeat("b", bulkPacket)
	var want []string
	for i := range 20 {
		payload := fmt.Sprintf("%02d", i)
		if i%4 == 0 {
			payload += bulk // apart
		}
		var pkts stack.PacketBufferList
		pkts.PushBack(tcpPacket(l, header.IPv4MinimumSize, stack.GSO{}, header.TCPFlagAck, payload))
		if n, err := l.WritePackets(pkts); n != 1 || err != nil {
			t.Fatalf("packet %d: WritePackets: %d, %v", i, n, err)
		}
		pkts.Reset()
		want = append(want, payload[:2])
	}
	buf := make([]byte, 2*bulkPacket)
	for i, w := range want {
		n, err := unix.Read(guest, buf)
		if err != nil {
			t.Fatalf("the guest read packet %d: %v", i, err)
		}
		payload := header.TCP(buf[vnetHdrLen+header.IPv4MinimumSize : n]).Payload()
		if got := string(payload[:2]); got != w {
			t.Fatalf("the guest's packet %d is the stack's %s, want %s", i, got, w)
		}
	}
}

// A segment built for offload reaches the guest with its checksum left to
// the guest's kernel: NEEDS_CSUM at the TCP header's checksum field, after
// an IP header of either version. One larger than its MSS is also to be
// cut into segments of the MSS.
func TestLinkOffloadsTCPChecksums(t *testing.T) {
	queue, guest := packetQueue(t, true)
	l, _ := attached(t, queue)
	payload := strings.Repeat("x", 1500)
	for _, c := range []struct {
		name string
		l3   int
		gso  stack.GSO
		want vnetHdr
	}{
		{"IPv4", header.IPv4MinimumSize,
			stack.GSO{Type: stack.GSOTCPv4, NeedsCsum: true, CsumOffset: header.TCPChecksumOffset, MSS: 1500},
			vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, csumStart: 20, csumOffset: 16}},
		{"IPv6", header.IPv6MinimumSize,
			stack.GSO{Type: stack.GSOTCPv6, NeedsCsum: true, CsumOffset: header.TCPChecksumOffset, MSS: 1500},
			vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, csumStart: 40, csumOffset: 16}},
		{"IPv4 over the MSS", header.IPv4MinimumSize,
			stack.GSO{Type: stack.GSOTCPv4, NeedsCsum: true, CsumOffset: header.TCPChecksumOffset, MSS: 1000},
			vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, gsoType: unix.VIRTIO_NET_HDR_GSO_TCPV4, gsoSize: 1000, hdrLen: 40, csumStart: 20, csumOffset: 16}},
		{"IPv6 over the MSS", header.IPv6MinimumSize,
			stack.GSO{Type: stack.GSOTCPv6, NeedsCsum: true, CsumOffset: header.TCPChecksumOffset, MSS: 1000},
			vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, gsoType: unix.VIRTIO_NET_HDR_GSO_TCPV6, gsoSize: 1000, hdrLen: 60, csumStart: 40, csumOffset: 16}},
	} {
		pkt := tcpPacket(l, c.l3, c.gso, header.TCPFlagAck, payload)
		var pkts stack.PacketBufferList
		pkts.PushBack(pkt)
		if n, err := l.WritePackets(pkts); n != 1 || err != nil {
			t.Fatalf("%s: WritePackets: %d, %v", c.name, n, err)
		}
		pkts.Reset()
		hdr, packet := readFrame(t, guest)
		want := make([]byte, vnetHdrLen)
		c.want.encode(want)
		if !bytes.Equal(hdr, want) {
			t.Errorf("%s: header %v, want %v", c.name, hdr, want)
		}
		if got := string(header.TCP(packet[c.l3:]).Payload()); got != payload {
			t.Errorf("%s: %d bytes of payload, want %d", c.name, len(got), len(payload))
		}
	}
}

// stop ends a reader even while the guest sends without pause, and a
// stopped link delivers nothing more.
func TestLinkStopsWhileTheGuestFloods(t *testing.T) {
	queue, guest := packetQueue(t, true)
	l, err := newTUNLink([]*os.File{queue})
	if err != nil {
		t.Fatal(err)
	}
	var count atomic.Int64
	counter := &countingDispatcher{&count}
	l.Attach(counter)
	flooding := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		packet := frame(vnetHdr{}, versionPacket(4, 60, 'x'))
		for {
			select {
			case <-flooding:
				return
			default:
				unix.Write(guest, packet)
			}
		}
	}()
	defer func() {
		close(flooding)
		<-done
	}()
	for count.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() {
		l.stop()
		l.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the link's reader did not stop while the guest was sending")
	}
	after := count.Load()
	time.Sleep(50 * time.Millisecond)
	if n := count.Load(); n != after {
		t.Errorf("%d packets delivered after stop", n-after)
	}
}

type countingDispatcher struct{ n *atomic.Int64 }

func (c *countingDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {
	c.n.Add(1)
}

func (c *countingDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

// A queue the poller does not serve (a blocking descriptor) is refused:
// its reader could not be stopped.
func TestLinkRefusesABlockingQueue(t *testing.T) {
	queue, _ := packetQueue(t, false)
	_, err := newTUNLink([]*os.File{queue})
	if err == nil || !strings.Contains(err.Error(), "not served by the poller") {
		t.Fatalf("newTUNLink of a blocking queue: %v, want refused", err)
	}
}
