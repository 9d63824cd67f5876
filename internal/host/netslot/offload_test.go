package netslot_test

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// The TCP checksums on the slot's link are left partial both ways, over
// IPv4 and IPv6: a packet socket in the guest's namespace sees the slot's
// segments and the guest's own as not yet summed, from the TCP header on
// into its checksum field, and each of the slot's, summed there as the
// guest's kernel sums one it forwards, carries the right checksum.
func TestSlotOffloadsTCPChecksums(t *testing.T) {
	inet := nettest.NewInternet(t)
	s := newSlot(t)
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 600))
	sniffer := sniff(t, s)
	for _, l := range []net.Listener{
		inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0"),
		inet.Listen(t, "tcp6", "["+nettest.HostIPv6.String()+"]:0"),
	} {
		go echo(l)
		dst := l.Addr().(*net.TCPAddr).AddrPort()
		carried(t, s, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()), strings.Repeat("x", 2000))
		checkOffloaded(t, sniffer, dst.Port())
	}
}

// checkOffloaded reads sniffer until it has seen a data segment of a
// connection to port both from the slot and from the guest, each with its
// checksum left partial, and the slot's right once summed.
func checkOffloaded(t *testing.T, sniffer int, port uint16) {
	t.Helper()
	var fromSlot, fromGuest int
	buf := make([]byte, 1<<17)
	for fromSlot == 0 || fromGuest == 0 {
		n, from, err := unix.Recvfrom(sniffer, buf, 0)
		if err != nil {
			t.Fatalf("port %d: after %d segments with data from the slot and %d from the guest: %v", port, fromSlot, fromGuest, err)
		}
		if n < netslot.VnetHdrLen {
			t.Fatalf("a packet of %d bytes, shorter than its virtio_net_hdr", n)
		}
		packet := buf[netslot.VnetHdrLen:n]
		src, dst, seg, ok := tcpSegment(packet)
		if !ok || len(seg.Payload()) == 0 || (seg.SourcePort() != port && seg.DestinationPort() != port) {
			continue
		}
		h := netslot.DecodeVnetHdr(buf)
		start, offset := int(h.CsumStart), int(h.CsumOffset)
		if l3 := len(packet) - len(seg); h.Flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM == 0 || start != l3 || offset != header.TCPChecksumOffset {
			t.Fatalf("a segment with data from %s: flags %#x, checksum from %d into %d, want it left partial from %d into %d",
				src, h.Flags, start, offset, l3, header.TCPChecksumOffset)
		}
		if from.(*unix.SockaddrLinklayer).Pkttype == unix.PACKET_OUTGOING {
			fromGuest++
			continue
		}
		fromSlot++
		// The guest's kernel sums the segment from start on, the checksum
		// field holding the pseudo-header's sum, and stores the complement
		// at start+offset.
		summed := append([]byte(nil), packet...)
		binary.BigEndian.PutUint16(summed[start+offset:], ^checksum.Checksum(summed[start:], 0))
		done := header.TCP(summed[start:])
		if !done.IsChecksumValid(src, dst, checksum.Checksum(done.Payload(), 0), uint16(len(done.Payload()))) {
			t.Fatalf("a segment of the slot's from %s, summed as the guest's kernel sums it, has a wrong checksum", src)
		}
	}
}

// tcpSegment is the TCP segment of the IP packet b, with its addresses.
func tcpSegment(b []byte) (src, dst tcpip.Address, seg header.TCP, ok bool) {
	switch header.IPVersion(b) {
	case header.IPv4Version:
		ip := header.IPv4(b)
		if !ip.IsValid(len(b)) || ip.TransportProtocol() != header.TCPProtocolNumber {
			return src, dst, nil, false
		}
		return ip.SourceAddress(), ip.DestinationAddress(), header.TCP(ip.Payload()), true
	case header.IPv6Version:
		ip := header.IPv6(b)
		if !ip.IsValid(len(b)) || ip.TransportProtocol() != header.TCPProtocolNumber {
			return src, dst, nil, false
		}
		return ip.SourceAddress(), ip.DestinationAddress(), header.TCP(ip.Payload()), true
	}
	return src, dst, nil, false
}

// sniff opens a packet socket on the guest's side of s's link that reads
// each packet after its virtio_net_hdr, as the guest's kernel has it, and
// fails a read after 5 s without packets.
func sniff(t *testing.T, s *netslot.Slot) int {
	t.Helper()
	all := int(htons(unix.ETH_P_ALL))
	var fd int
	err := netnsfile.Do(s.Path(), func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, all)
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(all), Ifindex: ifi.Index})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		t.Fatal(err)
	}
	// Room for every packet of a test, which reads them after its
	// transfer: a full buffer drops what comes next.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20); err != nil {
		t.Fatal(err)
	}
	timeout := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &timeout); err != nil {
		t.Fatal(err)
	}
	return fd
}

// htons is v in network byte order, as a packet socket takes a protocol.
func htons(v uint16) uint16 {
	return binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, v))
}

// A guest whose MSS is smaller than the stack's segments (here set on its
// socket; a lower MTU or a clamped MSS does the same) gets them whole: the
// stack sends segments of up to the link's size marked for its kernel to
// cut at that MSS.
func TestSlotSegmentsForASmallMSS(t *testing.T) {
	const mss = 1000
	dst := echoOnTestHost(t)
	s := newSlot(t)
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 600))
	sniffer := sniff(t, s)
	var c net.Conn
	err := netnsfile.Do(s.Path(), func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss) })
			return errors.Join(err, serr)
		}}
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	sent := make([]byte, 256<<10)
	rand.Read(sent)
	go c.Write(sent)
	got := make([]byte, len(sent))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("the echo of 256 KiB: %v", err)
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("the echo differs from what was sent")
	}

	buf := make([]byte, 1<<17)
	for {
		n, from, err := unix.Recvfrom(sniffer, buf, 0)
		if err != nil {
			t.Fatalf("no segment of the slot's was marked to be cut: %v", err)
		}
		if from.(*unix.SockaddrLinklayer).Pkttype == unix.PACKET_OUTGOING || n < netslot.VnetHdrLen {
			continue
		}
		if h := netslot.DecodeVnetHdr(buf); h.GSOType == unix.VIRTIO_NET_HDR_GSO_TCPV4 {
			if h.GSOSize > mss || n-netslot.VnetHdrLen <= mss {
				t.Fatalf("a segment of %d bytes marked to be cut at %d, with an MSS of %d", n-netslot.VnetHdrLen, h.GSOSize, mss)
			}
			return
		}
	}
}
