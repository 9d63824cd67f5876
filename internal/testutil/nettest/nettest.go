// Package nettest gives network tests an "internet" test host: a network
// namespace joined to the host by a veth pair, with documentation
// addresses (198.51.100.0/24, 2001:db8:5100::/64) that the hard deny covers
// unless the deployment's unsafe exemption names them. Tests serve on it and
// reach into other namespaces (a workspace's slot) without sending anything
// beyond the machine.
package nettest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// The test host's addresses, and the host side of its link.
var (
	HostIPv4     = netip.MustParseAddr("198.51.100.2")
	HostIPv6     = netip.MustParseAddr("2001:db8:5100::2")
	UplinkIPv4   = netip.MustParseAddr("198.51.100.1")
	UplinkIPv6   = netip.MustParseAddr("2001:db8:5100::1")
	ExemptRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:5100::/64")}
)

// Internet is the test host.
type Internet struct {
	// Path is its network namespace.
	Path string
	// HostLink is the host's side of its link, which holds UplinkIPv4 and
	// UplinkIPv6.
	HostLink string
}

// NewInternet creates the test host; cleanup removes it with its link.
func NewInternet(t testing.TB) *Internet {
	t.Helper()
	hosttest.RequireRoot(t)
	in, stop, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return in
}

func link(path, hostSide, peer string) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostSide}, PeerName: peer, PeerNamespace: netlink.NsFd(ns)}); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	// Without duplicate address detection the IPv6 link works at once,
	// not a second or two after the link comes up.
	noDAD := func(name string) error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/accept_dad", []byte("0"), 0o644)
	}
	if err := noDAD(hostSide); err != nil {
		return err
	}
	if err := netnsfile.Do(path, func() error { return noDAD(peer) }); err != nil {
		return err
	}
	up := func(h *netlink.Handle, name string, addrs ...netip.Prefix) error {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(a), Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		return h.LinkSetUp(l)
	}
	root, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer root.Close()
	if err := up(root, hostSide, netip.PrefixFrom(UplinkIPv4, 24), netip.PrefixFrom(UplinkIPv6, 64)); err != nil {
		return err
	}
	if err := up(h, peer, netip.PrefixFrom(HostIPv4, 24), netip.PrefixFrom(HostIPv6, 64)); err != nil {
		return err
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.LinkSetUp(lo)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Listen opens a listener inside the test host.
func (in *Internet) Listen(t testing.TB, network, address string) net.Listener {
	t.Helper()
	var l net.Listener
	err := netnsfile.Do(in.Path, func() (err error) {
		l, err = net.Listen(network, address)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// ListenPacket opens a packet listener inside the test host.
func (in *Internet) ListenPacket(t testing.TB, network, address string) net.PacketConn {
	t.Helper()
	var c net.PacketConn
	err := netnsfile.Do(in.Path, func() (err error) {
		c, err = net.ListenPacket(network, address)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Dial connects from inside the namespace at path (a slot's, for one).
// Sockets keep the namespace they were made in, so the connection works
// from any goroutine afterwards.
func Dial(ctx context.Context, path, network, address string) (net.Conn, error) {
	var c net.Conn
	err := netnsfile.Do(path, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Start creates the test host for a program that is not a test (a
// benchmark), its namespace bound under dir; stop removes it with its link.
//
// The test host's addresses are fixed, so one machine has one at a time:
// Start waits for the test host of another process (another test package
// run in parallel, a benchmark) to be stopped.
func Start(dir string) (in *Internet, stop func(), err error) {
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "kibotos-nettest.lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		return nil, nil, err
	}
	if err := removeStaleLinks(); err != nil {
		lock.Close()
		return nil, nil, err
	}
	var b [4]byte
	rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	path := filepath.Join(dir, "inet-"+suffix)
	hostSide := hostSidePrefix + suffix
	stop = func() {
		unix.Unmount(path, unix.MNT_DETACH) // the veth pair goes with the namespace
		if l, err := netlink.LinkByName(hostSide); err == nil {
			netlink.LinkDel(l)
		}
		os.Remove(path)
		lock.Close() // releases the lock
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		stop()
		return nil, nil, err
	}
	if err := netnsfile.Create(path, func() error { return nil }); err != nil {
		stop()
		return nil, nil, err
	}
	if err := link(path, hostSide, "kbp"+suffix); err != nil {
		stop()
		return nil, nil, err
	}
	return &Internet{Path: path, HostLink: hostSide}, stop, nil
}

// hostSidePrefix begins the name of a test host's link in the host's
// namespace.
const hostSidePrefix = "kbt"

// removeStaleLinks deletes the links that test hosts of processes that died
// left in the host's namespace (a test binary that panicked runs no
// cleanup, and the namespace's bind mount keeps the pair alive): each holds
// the test host's fixed addresses and would take its traffic. Start calls
// it holding the lock, so no live process has a test host.
func removeStaleLinks() error {
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		name := l.Attrs().Name
		if _, ok := l.(*netlink.Veth); !ok || !strings.HasPrefix(name, hostSidePrefix) {
			continue
		}
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("removing the stale test host link %s: %w", name, err)
		}
		fmt.Fprintf(os.Stderr, "nettest: removed the link %s, left by a test host whose process died\n", name)
	}
	return nil
}

// InterfaceBytes reads the bytes received and sent on the interface iface
// from the text of /proc/net/dev, as a guest sees its own link.
func InterfaceBytes(procNetDev, iface string) (received, sent uint64, err error) {
	for _, line := range strings.Split(procNetDev, "\n") {
		name, counters, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != iface {
			continue
		}
		// Eight receive columns (bytes first), then the transmit ones.
		f := strings.Fields(counters)
		if len(f) < 16 {
			break
		}
		if received, err = strconv.ParseUint(f[0], 10, 64); err == nil {
			sent, err = strconv.ParseUint(f[8], 10, 64)
		}
		return received, sent, err
	}
	return 0, 0, fmt.Errorf("no counters of %s in %q", iface, procNetDev)
}

// LinkBytes returns the bytes the guest's link (eth0) in the network
// namespace bound at path received and sent, as the guest reads them: its
// /proc/net/dev.
func LinkBytes(t testing.TB, path string) (received, sent uint64) {
	t.Helper()
	var dev []byte
	if err := netnsfile.Do(path, func() (err error) {
		dev, err = os.ReadFile("/proc/thread-self/net/dev")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	received, sent, err := InterfaceBytes(string(dev), "eth0")
	if err != nil {
		t.Fatal(err)
	}
	return received, sent
}
