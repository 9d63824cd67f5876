package netslot_test

import (
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/netslot"
)

// TestSlotGuestIPv6AddressesReadyOnCreate checks that a guest can receive
// at each of its IPv6 addresses as soon as its slot exists: none is
// tentative, and the kernel delivers a packet the stack sends to it over
// the link. Otherwise the answers to a guest's first IPv6 packets are lost.
func TestSlotGuestIPv6AddressesReadyOnCreate(t *testing.T) {
	h, link := guestLink(t, newSlot(t))
	addrs, err := h.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var guest, linkLocal bool
	for _, a := range addrs {
		if a.Flags&unix.IFA_F_TENTATIVE != 0 {
			t.Errorf("address %s is tentative", a.IP)
		}
		routes, err := h.RouteGetWithOptions(a.IP, &netlink.RouteGetOptions{Iif: "eth0", SrcAddr: netslot.GatewayIPv6})
		if err != nil || len(routes) != 1 || routes[0].Type != unix.RTN_LOCAL {
			t.Errorf("packet from the link to %s: routes %v (%v), want it delivered locally", a.IP, routes, err)
		}
		guest = guest || a.IP.Equal(netslot.GuestIPv6)
		linkLocal = linkLocal || a.IP.IsLinkLocalUnicast()
	}
	if !guest || !linkLocal {
		t.Errorf("addresses %v, want %s and a link-local one", addrs, netslot.GuestIPv6)
	}
}

// TestSlotLinkHasNoQueue checks that the guest's link sends without a
// qdisc: the kernel's default for a multi-queue device holds 3.3 MiB of
// rings per workspace that queue nothing.
func TestSlotLinkHasNoQueue(t *testing.T) {
	h, link := guestLink(t, newSlot(t))
	qdiscs, err := h.QdiscList(link)
	if err != nil {
		t.Fatal(err)
	}
	if len(qdiscs) != 1 || qdiscs[0].Type() != "noqueue" || qdiscs[0].Attrs().Parent != netlink.HANDLE_ROOT {
		var got []string
		for _, q := range qdiscs {
			got = append(got, q.Type())
		}
		t.Errorf("qdiscs of the guest's link: %v, want one noqueue at the root", got)
	}
}

// guestLink returns a netlink handle in the slot's namespace, closed when
// the test ends, and the guest's link.
func guestLink(t *testing.T, s *netslot.Slot) (*netlink.Handle, netlink.Link) {
	t.Helper()
	ns, err := netns.GetFromPath(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	link, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return h, link
}
