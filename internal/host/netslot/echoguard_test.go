package netslot_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/host/netslot"
)

// fragmentedPing sends an echo request to dst from inside the slot in two
// IPv4 fragments and returns the type of the ICMP message that answers it,
// or nil when none arrives.
func fragmentedPing(t *testing.T, s *netslot.Slot, dst netip.Addr) icmp.Type {
	t.Helper()
	var pc net.PacketConn
	if err := netnsfile.Do(s.Path(), func() (err error) {
		pc, err = net.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	raw, err := ipv4.NewRawConn(pc)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 64)
	copy(data, "kibotos")
	m, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: 78, Seq: 1, Data: data}}).Marshal(nil)
	for i, part := range [][]byte{m[:24], m[24:]} {
		h := &ipv4.Header{Version: 4, Len: ipv4.HeaderLen, TotalLen: ipv4.HeaderLen + len(part), ID: 4242, TTL: 64,
			Protocol: 1, Dst: dst.AsSlice(), FragOff: i * 3}
		if i == 0 {
			h.Flags = ipv4.MoreFragments
		}
		if err := raw.WriteTo(h, part, nil); err != nil {
			t.Fatal(err)
		}
	}
	raw.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1500)
	for {
		_, p, _, err := raw.ReadFrom(buf)
		if err != nil {
			return nil
		}
		r, err := icmp.ParseMessage(1, p)
		if err != nil || r.Type == ipv4.ICMPTypeEcho {
			continue
		}
		return r.Type
	}
}

// fragmentedPing6 sends an echo request to dst from inside the slot in
// two IPv6 fragments and returns the type of the ICMPv6 message that
// answers it, or nil when none arrives.
func fragmentedPing6(t *testing.T, s *netslot.Slot, dst netip.Addr) icmp.Type {
	t.Helper()
	var out, in net.PacketConn
	if err := netnsfile.Do(s.Path(), func() (err error) {
		if out, err = net.ListenPacket("ip6:44", "::"); err != nil {
			return err
		}
		in, err = net.ListenPacket("ip6:ipv6-icmp", "::")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	defer in.Close()
	data := make([]byte, 64)
	copy(data, "kibotos")
	// Raw, so the checksum is not the kernel's to fill in.
	m, _ := (&icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: &icmp.Echo{ID: 79, Seq: 1, Data: data}}).Marshal(icmp.IPv6PseudoHeader(netslot.GuestIPv6, dst.AsSlice()))
	// Fragment headers: next header ICMPv6, offset in 8-byte units with the
	// more-fragments bit, identification.
	for _, frag := range []struct {
		header []byte
		part   []byte
	}{{[]byte{58, 0, 0, 1, 0, 0, 0x42, 0x42}, m[:24]}, {[]byte{58, 0, 0, 24, 0, 0, 0x42, 0x42}, m[24:]}} {
		if _, err := out.WriteTo(append(frag.header, frag.part...), &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			t.Fatal(err)
		}
	}
	in.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1500)
	for {
		n, _, err := in.ReadFrom(buf)
		if err != nil {
			return nil
		}
		r, err := icmp.ParseMessage(58, buf[:n])
		if err != nil || r.Type != ipv6.ICMPTypeEchoReply && r.Type != ipv6.ICMPTypeDestinationUnreachable {
			continue // its own request, neighbor discovery
		}
		return r.Type
	}
}

// TestSlotHiddenEcho checks that echo requests the guard cannot see at
// once, fragmented or behind IPv6 extension headers, are not answered by
// the stack for any address.
func TestSlotHiddenEcho(t *testing.T) {
	s := newSlot(t)
	s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, 0))
	if got := fragmentedPing(t, s, netip.MustParseAddr("203.0.113.9")); got != nil {
		t.Errorf("DENY_ALL: a fragmented echo request was answered with %v", got)
	}
	if got := fragmentedPing6(t, s, netip.MustParseAddr("2001:db8:99::9")); got != nil {
		t.Errorf("DENY_ALL: a fragmented IPv6 echo request was answered with %v", got)
	}
}
