package netslot_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
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
// segments and the guest's own as not yet summed (TP_STATUS_CSUMNOTREADY),
// and each of the slot's, summed as the guest's kernel sums one it
// forwards, carries the right checksum.
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
	buf, oob := make([]byte, 1<<16), make([]byte, 256)
	for fromSlot == 0 || fromGuest == 0 {
		n, oobn, _, from, err := unix.Recvmsg(sniffer, buf, oob, 0)
		if err != nil {
			t.Fatalf("port %d: after %d segments with data from the slot and %d from the guest: %v", port, fromSlot, fromGuest, err)
		}
		src, dst, seg, ok := tcpSegment(buf[:n])
		if !ok || len(seg.Payload()) == 0 || (seg.SourcePort() != port && seg.DestinationPort() != port) {
			continue
		}
		if status := auxStatus(t, oob[:oobn]); status&unix.TP_STATUS_CSUMNOTREADY == 0 {
			t.Fatalf("a segment with data from %s came with its checksum complete (status %#x), want it left partial", src, status)
		}
		if from.(*unix.SockaddrLinklayer).Pkttype == unix.PACKET_OUTGOING {
			fromGuest++
			continue
		}
		fromSlot++
		// The guest's kernel sums the segment from the checksum field on,
		// which holds the pseudo-header's sum, and stores the complement.
		summed := append(header.TCP(nil), seg...)
		summed.SetChecksum(^checksum.Checksum(summed, 0))
		payload := summed.Payload()
		if !summed.IsChecksumValid(src, dst, checksum.Checksum(payload, 0), uint16(len(payload))) {
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

// sniff opens a packet socket on the guest's side of s's link, with each
// packet's auxiliary data, that a read without packets fails after 5 s.
func sniff(t *testing.T, s *netslot.Slot) int {
	t.Helper()
	all := int(htons(unix.ETH_P_ALL))
	var fd int
	err := netnsfile.Do(s.Path(), func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, all)
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(all), Ifindex: ifi.Index})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
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

// auxStatus is tp_status of a packet's PACKET_AUXDATA message.
func auxStatus(t *testing.T, oob []byte) uint32 {
	t.Helper()
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA && len(m.Data) >= 4 {
			return binary.NativeEndian.Uint32(m.Data)
		}
	}
	t.Fatal("a packet came without its auxiliary data")
	return 0
}
