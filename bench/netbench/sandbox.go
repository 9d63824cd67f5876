package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/host/netpolicy"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// sandbox is one sandbox network: a network namespace whose traffic a
// user-mode network carries to sockets on the host.
type sandbox struct {
	name string
	path string // the namespace's bind mount; empty for the host's own
	// dns is the resolver its guest queries; unset, the test host's.
	dns netip.AddrPort
	// viaProxy, when set, points the sandbox at the SOCKS5 server that
	// carries its next measurement; unset, its client connects directly.
	viaProxy func(netip.AddrPort) error
	// proxy is the SOCKS5 server the client itself connects through (the
	// host-socks5 row); unset, the client dials the server.
	proxy netip.AddrPort
	stop  func() error
	// cpu is the CPU time the network has used so far: the slot's, in
	// this process, or its serving process'; nil for the host's own.
	cpu func() time.Duration
	// output is what the serving process printed, once it has exited.
	output bytes.Buffer
}

// failed stops sb after its serving process failed to serve.
func (sb *sandbox) failed(err error) error {
	sb.stop()
	if out := bytes.TrimSpace(sb.output.Bytes()); len(out) > 0 {
		return fmt.Errorf("%w: %s", err, out)
	}
	return err
}

// startSandbox starts the sandbox network name; dns is the deployment
// resolver of the slots.
func startSandbox(name, dir string, dns netip.AddrPort) (*sandbox, error) {
	path := filepath.Join(dir, name)
	switch name {
	case "kibotos":
		return startSlot(name, path, dns, false)
	case "socks5":
		return startSlot(name, path, dns, true)
	case "pasta":
		return startPasta(path)
	case "slirp4netns":
		return startSlirp(path)
	case "host":
		return &sandbox{name: name, stop: func() error { return nil }}, nil
	case "host-socks5":
		sb := &sandbox{name: name, stop: func() error { return nil }}
		sb.viaProxy = func(a netip.AddrPort) error { sb.proxy = a; return nil }
		return sb, nil
	}
	return nil, fmt.Errorf("unknown network %q (kibotos, socks5, pasta, slirp4netns, host, host-socks5)", name)
}

// startSlot creates a network slot whose policy lets the guest reach the
// test host, through a SOCKS5 Egress when proxied, and whose deployment
// resolver is dns.
func startSlot(name, path string, dns netip.AddrPort, proxied bool) (*sandbox, error) {
	s, err := netslot.Create(netslot.Config{Path: path, HardDeny: netpolicy.HardDeny{Exempt: nettest.ExemptRanges},
		DeploymentResolvers: []netip.AddrPort{dns}})
	if err != nil {
		return nil, err
	}
	revision := uint64(0)
	// apply sets the slot's policy, with every connection to the test host
	// going through the SOCKS5 server at proxy when it is valid.
	apply := func(proxy netip.AddrPort) error {
		revision++
		n := &hostv1.NetworkAssignment{Policy: &ctrlv1.NetworkPolicy{
			Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, Revision: revision}}
		if proxy.IsValid() {
			n.Policy.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: "bench", Destinations: []string{"198.51.100.0/24"}}}
			n.Egresses = []*hostv1.EgressAssignment{{EgressId: "bench", Revision: revision,
				Spec: &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: proxy.String()}}}}}
		}
		s.Apply(n)
		if msg := s.Report().FailureMessage; msg != "" {
			return errors.New(msg)
		}
		return nil
	}
	if err := apply(netip.AddrPort{}); err != nil {
		s.Destroy()
		return nil, err
	}
	link := netip.AddrPortFrom(netslot.LinkDNS(nil), 53)
	sb := &sandbox{name: name, path: path, dns: link, stop: s.Destroy, cpu: ownCPU}
	if proxied {
		sb.viaProxy = apply
	}
	return sb, nil
}

// startPasta attaches pasta to a new namespace. The guest gets the same
// addresses as under slirp4netns; the template interface is the test
// host's link, so nothing depends on the machine's own uplink.
func startPasta(path string) (*sandbox, error) {
	if err := newNamespace(path); err != nil {
		return nil, err
	}
	uplink, err := uplink()
	if err != nil {
		removeNamespace(path)
		return nil, err
	}
	cmd := exec.Command("pasta", "--config-net", "--foreground", "--quiet",
		// As root pasta would switch to nobody, who may not join a
		// namespace of the initial user namespace.
		"--runas", "0",
		"--ipv4-only", "--interface", uplink, "--ns-ifname", "eth0",
		"--address", "10.0.2.100", "--netmask", "24", "--gateway", "10.0.2.2", "--mtu", fmt.Sprint(mtu),
		"--tcp-ports", "none", "--udp-ports", "none", "--tcp-ns", "none", "--udp-ns", "none",
		"--no-map-gw", "--dns", "none",
		"--netns", path)
	sb, err := startProvider("pasta", cmd, path)
	if err != nil {
		return nil, err
	}
	if err := waitRoute(path, 5*time.Second); err != nil {
		return nil, sb.failed(fmt.Errorf("pasta did not configure the namespace: %w", err))
	}
	return sb, nil
}

// startSlirp attaches slirp4netns to a new namespace and waits until it
// says it is ready.
func startSlirp(path string) (*sandbox, error) {
	if err := newNamespace(path); err != nil {
		return nil, err
	}
	ready, w, err := os.Pipe()
	if err != nil {
		removeNamespace(path)
		return nil, err
	}
	defer ready.Close()
	cmd := exec.Command("slirp4netns", "--configure", fmt.Sprintf("--mtu=%d", mtu), "--disable-host-loopback",
		"--netns-type=path", "--ready-fd=3", path, "tap0")
	cmd.ExtraFiles = []*os.File{w}
	sb, err := startProvider("slirp4netns", cmd, path)
	w.Close()
	if err != nil {
		return nil, err
	}
	ready.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := ready.Read(make([]byte, 1)); err != nil {
		return nil, sb.failed(fmt.Errorf("slirp4netns not ready: %w", err))
	}
	return sb, nil
}

// startProvider starts the process that serves the namespace at path; the
// sandbox's stop ends it (by its PID) and removes the namespace.
func startProvider(name string, cmd *exec.Cmd, path string) (*sandbox, error) {
	sb := &sandbox{name: name, path: path}
	cmd.Stdout, cmd.Stderr = &sb.output, &sb.output
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		removeNamespace(path)
		return nil, err
	}
	sb.cpu = func() time.Duration { return processCPU(cmd.Process.Pid) }
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	sb.stop = func() error {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
		return removeNamespace(path)
	}
	return sb, nil
}

// processCPU is the CPU time the process pid has used, 0 once it has
// exited. /proc counts it in ticks of 10 ms (USER_HZ is 100 on Linux).
func processCPU(pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, which may hold spaces, in
	// parentheses: utime and stime are the 12th and 13th.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// newNamespace makes an empty network namespace bound at path.
func newNamespace(path string) error {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return err
	}
	if err := netnsfile.Create(path, func() error { return nil }); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// removeNamespace releases the namespace bound at path.
func removeNamespace(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return os.Remove(path)
}

// uplink names the host's side of the test host's link. Tests that run
// meanwhile make test hosts with the same addresses, which takes the route
// to the server away from this one: that is an error.
func uplink() (string, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", err
	}
	var names []string
	for _, a := range addrs {
		if a.IP.Equal(nettest.UplinkIPv4.AsSlice()) {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return "", err
			}
			names = append(names, l.Attrs().Name)
		}
	}
	if len(names) != 1 {
		return "", fmt.Errorf("%d links hold %s (%v), want this run's test host alone: run netbench while no network test runs",
			len(names), nettest.UplinkIPv4, names)
	}
	return names[0], nil
}

// waitRoute waits until the namespace at path has an IPv4 default route.
func waitRoute(path string, timeout time.Duration) error {
	h, err := handleAt(path)
	if err != nil {
		return err
	}
	defer h.Close()
	for deadline := time.Now().Add(timeout); ; {
		routes, err := h.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("no default route")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkMTU names the guest's link in the namespace at path and checks that
// its MTU is mtu.
func checkMTU(path string) (string, error) {
	h, err := handleAt(path)
	if err != nil {
		return "", err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return "", err
	}
	for _, l := range links {
		if a := l.Attrs(); a.Flags&net.FlagLoopback == 0 && a.Flags&net.FlagUp != 0 {
			if a.MTU != mtu {
				return "", fmt.Errorf("guest link %s has MTU %d, want %d", a.Name, a.MTU, mtu)
			}
			return a.Name, nil
		}
	}
	return "", errors.New("no guest link is up")
}

func handleAt(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}
