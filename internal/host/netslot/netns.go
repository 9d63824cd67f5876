package netslot

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/netnsfile"
)

// The slot's addresses. Every slot has the same ones: each lives in its own
// namespace and its far side is this process's stack, not the host's.
var (
	// GuestIPv4 and GuestIPv6 are the guest's addresses on the link.
	GuestIPv4 = net.IPv4(10, 211, 0, 2).To4()
	GuestIPv6 = net.ParseIP("fd6b:6962::2")
	// GatewayIPv4 is the stack's IPv4 address on the link; GatewayIPv6 is
	// fe80::1, the IPv6 link DNS address.
	GatewayIPv4 = net.IPv4(10, 211, 0, 1).To4()
	GatewayIPv6 = net.ParseIP("fe80::1")
)

const (
	// ifName is the guest's only interface besides loopback.
	ifName = "eth0"
	// tunQueues is how many queues a new slot's TUN device has, each
	// read by a goroutine of its own: with one, gVisor's reader waited
	// for each packet in turn, and a guest's DNS queries answered from
	// the cache came at less than half the rate of the host's own. The
	// slot's own reader (link.go) measured alike with one and two.
	tunQueues = 2
	// MTU is the link's MTU: large segments make the userspace stack fast.
	MTU = 65520
	// linkPrefix4 and linkPrefix6 are the link's prefix lengths.
	linkPrefix4 = 24
	linkPrefix6 = 64
	// ipv6StartTimeout bounds the wait for the kernel to finish bringing up
	// the link's IPv6 addresses, which takes milliseconds.
	ipv6StartTimeout = 10 * time.Second
)

// createNamespace makes a network namespace kept alive by a bind mount at
// path, with loopback up and a persistent TUN device configured as the
// guest's link, and returns the files of the device's queues. The
// namespace has no other interface, so everything the guest sends
// off-host reaches the returned files.
func createNamespace(path string) (queues []*os.File, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			queues = nil
			destroyNamespace(path)
		}
	}()
	queues, err = inNamespace(path, true)
	if err != nil {
		return nil, err
	}
	if err := configure(path); err != nil {
		closeAll(queues)
		return nil, err
	}
	return queues, nil
}

// openNamespace reattaches to the TUN device of a namespace created by an
// earlier process (the device is persistent, so it outlived that process's
// files).
func openNamespace(path string) ([]*os.File, error) {
	return inNamespace(path, false)
}

// destroyNamespace releases the namespace at path: once the mount is gone
// and no process is in it, the kernel deletes it with its TUN device.
func destroyNamespace(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount network namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// openTUN opens (creating, or attaching to) the persistent TUN device of
// the calling thread's namespace: tunQueues queues, each a file with a
// reader of its own, or one when the device was made with a single queue
// (by an earlier version, which a reattach finds).
func openTUN() (queues []*os.File, err error) {
	first, err := attachTUN(unix.IFF_MULTI_QUEUE)
	if errors.Is(err, errSingleQueue) {
		first, err = attachTUN(0) // a single-queue device
		if err != nil {
			return nil, err
		}
		return []*os.File{first}, nil
	}
	if err != nil {
		return nil, err
	}
	queues = []*os.File{first}
	for len(queues) < tunQueues {
		q, err := attachTUN(unix.IFF_MULTI_QUEUE)
		if err != nil {
			closeAll(queues)
			return nil, err
		}
		queues = append(queues, q)
	}
	return queues, nil
}

// errSingleQueue is TUNSETIFF's refusal of a multi-queue file, which a
// single-queue device gives.
var errSingleQueue = errors.New("TUNSETIFF: the device has a single queue")

// attachTUN opens one file of the persistent TUN device ifName, with the
// flags besides IFF_TUN, IFF_NO_PI and IFF_VNET_HDR (vnet.go).
func attachTUN(flags uint16) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	req, err := unix.NewIfreq(ifName)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	req.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR | flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, req); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EINVAL) && flags&unix.IFF_MULTI_QUEUE != 0 {
			return nil, errSingleQueue
		}
		return nil, fmt.Errorf("TUNSETIFF: %w", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETPERSIST: %w", err)
	}
	// The guest's kernel may leave its checksums partial (vnet.go).
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETOFFLOAD: %w", err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun"), nil
}

// closeAll closes files.
func closeAll(files []*os.File) error {
	var err error
	for _, f := range files {
		err = errors.Join(err, f.Close())
	}
	return err
}

// configure brings the namespace's links up with the slot's addresses and
// default routes through the TUN device.
func configure(path string) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	link, err := h.LinkByName(ifName)
	if err != nil {
		return err
	}
	if err := h.LinkSetMTU(link, MTU); err != nil {
		return fmt.Errorf("set MTU: %w", err)
	}
	for _, a := range []*net.IPNet{
		{IP: GuestIPv4, Mask: net.CIDRMask(linkPrefix4, 32)},
		{IP: GuestIPv6, Mask: net.CIDRMask(linkPrefix6, 128)},
	} {
		// No duplicate address detection: nothing else is on the link, and
		// a tentative address would delay the guest's first IPv6 packets.
		if err := h.AddrAdd(link, &netlink.Addr{IPNet: a, Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("add address %s: %w", a, err)
		}
	}
	// The guest's packets go straight to the slot's queues. A multi-queue
	// TUN device has 256 transmit queues, and the root qdisc the kernel
	// gives it when it comes up (mq) puts a pfifo_fast with rings of its
	// own on each: 3.3 MiB of kernel memory per workspace, queueing nothing,
	// since the device drops what its own ring cannot take rather than
	// push back. Set before the link is up, noqueue takes that place.
	if err := h.QdiscReplace(&netlink.GenericQdisc{QdiscType: "noqueue",
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.HANDLE_ROOT}}); err != nil {
		return fmt.Errorf("set the link's qdisc: %w", err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("link up: %w", err)
	}
	for _, dst := range []*net.IPNet{
		{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
	} {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst}); err != nil {
			return fmt.Errorf("add default route %s: %w", dst, err)
		}
	}
	return awaitIPv6Addresses(ns, h, link)
}

// awaitIPv6Addresses waits until the kernel has finished bringing up the
// link's IPv6 addresses: none tentative, each with its local route.
//
// The kernel enters an IPv6 address's local route, without which it drops
// the packets sent to the address, only from a deferred work item, even for
// an address without duplicate address detection, which is usable as a
// source at once. On a loaded host that work runs late, and a guest started
// before it would lose the answers to its first packets (its first DNS
// query over IPv6 would wait for the resolver's retry).
func awaitIPv6Addresses(ns netns.NsHandle, h *netlink.Handle, link netlink.Link) error {
	updates := make(chan netlink.RouteUpdate)
	done := make(chan struct{})
	if err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{Namespace: &ns}); err != nil {
		return fmt.Errorf("watch routes: %w", err)
	}
	defer func() {
		close(done)
		for range updates { // until the subscription's reader ends
		}
	}()
	timeout := time.NewTimer(ipv6StartTimeout)
	defer timeout.Stop()
	for {
		waiting, err := unreadyIPv6Address(h, link)
		if err != nil || waiting == nil {
			return err
		}
		select {
		case <-updates:
		case <-timeout.C:
			return fmt.Errorf("IPv6 address %s not ready after %s", waiting, ipv6StartTimeout)
		}
	}
}

// unreadyIPv6Address is an IPv6 address of link that is tentative or has
// no local route yet; nil when there is none.
func unreadyIPv6Address(h *netlink.Handle, link netlink.Link) (net.IP, error) {
	addrs, err := h.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		return nil, err
	}
	local, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_TYPE)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if a.Flags&unix.IFA_F_TENTATIVE != 0 || !slices.ContainsFunc(local, func(r netlink.Route) bool {
			return r.Dst != nil && r.Dst.IP.Equal(a.IP)
		}) {
			return a.IP, nil
		}
	}
	return nil, nil
}

// inNamespace opens the TUN device's queues in the namespace at path,
// creating the namespace first when create is set.
func inNamespace(path string, create bool) (queues []*os.File, err error) {
	open := func() (err error) {
		queues, err = openTUN()
		return err
	}
	if create {
		err = netnsfile.Create(path, open)
	} else {
		err = netnsfile.Do(path, open)
	}
	if err != nil {
		closeAll(queues)
		queues = nil
	}
	return queues, err
}
