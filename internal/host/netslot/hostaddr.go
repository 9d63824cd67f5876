package netslot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// errHostAddress refuses a direct dial to an address of the host itself.
var errHostAddress = errors.New("the address is one of this host's own")

// errBound says that a socket's bind to its destination succeeded: the
// destination may be the host's.
var errBound = errors.New("the socket bound to its destination")

// dialDirect connects to dst from the host, refusing it with
// errHostAddress when the host holds it (see checkNotHost). The dial's own
// socket answers the common case with one system call: its bind to dst
// fails unless the host may hold dst, and the socket stays as it was.
func dialDirect(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Timeout: dialTimeout, Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = bindVerdict(unix.Bind(int(fd), sockaddr(dst.Addr()))) }); cerr != nil {
			return cerr
		}
		return err
	}}
	c, err := d.DialContext(ctx, "tcp", dst.String())
	if !errors.Is(err, errBound) {
		return c, err
	}
	if err := checkRoute(dst.Addr()); err != nil {
		return nil, err
	}
	d.Control = nil
	return d.DialContext(ctx, "tcp", dst.String())
}

// sockaddr is a's socket address with port 0.
func sockaddr(a netip.Addr) unix.Sockaddr {
	if a.Is4() {
		return &unix.SockaddrInet4{Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Addr: a.As16()}
}

// checkNotHost refuses a, for a direct dial, when the host holds it at this
// moment. The hard deny names the host's addresses too, but the host agent
// learns of a new one through netlink a moment after it appears; the kernel
// knows at once. A socket binds only to a local address, so the common
// answer is a failed bind; a bind that succeeds is confirmed by the routing
// table, since a host that allows binding any address (ip_nonlocal_bind)
// binds every one. Addresses that routes make local (AnyIP) are the host's
// too. An error of the check itself refuses: the dial would not be safe to
// make.
func checkNotHost(a netip.Addr) error {
	a = a.Unmap()
	family := unix.AF_INET6
	if a.Is4() {
		family = unix.AF_INET
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("checking whether %s is the host's: %w", a, err)
	}
	err = bindVerdict(unix.Bind(fd, sockaddr(a)))
	unix.Close(fd)
	switch {
	case errors.Is(err, errBound):
		return checkRoute(a)
	case err != nil:
		return fmt.Errorf("checking whether %s is the host's: %w", a, err)
	}
	return nil
}

// bindVerdict judges the bind of a socket to an address: nil when the host
// cannot hold the address (EADDRNOTAVAIL), errBound when the bind
// succeeded, else the bind's error.
func bindVerdict(err error) error {
	switch {
	case errors.Is(err, unix.EADDRNOTAVAIL):
		return nil
	case err == nil:
		return errBound
	}
	return err
}

// checkRoute refuses a when the routing table makes it local: the answer
// for an address a socket could bind to.
func checkRoute(a netip.Addr) error {
	routes, err := netlink.RouteGet(a.AsSlice())
	if err != nil {
		return fmt.Errorf("checking whether %s is the host's: %w", a, err)
	}
	if len(routes) > 0 && routes[0].Type != unix.RTN_LOCAL {
		return nil
	}
	return errHostAddress
}
