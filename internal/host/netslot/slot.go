// Package netslot is an execution's network slot: a network namespace whose
// only link is a TUN device, served on the host side by a userspace TCP/IP
// stack (gVisor netstack) in this process. Every guest connection ends here
// and is decided per connection by the workspace's policy (netpolicy): it is
// refused, dialed directly from the host, or forwarded through a SOCKS5
// Egress (socks5). The link DNS address is answered by a forwarder
// (dnsforward) to the deployment resolvers or the policy's Resolver,
// through a cache that each applied assignment starts empty.
//
// Policies, Egresses and Resolvers change live (Apply): new connections
// take the new path at once, and connections a change moves keep their old
// path until the change's drain deadline, then close.
package netslot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/kibotos/kibotos/internal/host/dnsforward"
	"github.com/kibotos/kibotos/internal/host/netpolicy"
)

const (
	nicID = 1
	// maxInFlight bounds the guest's half-open connections being dialed.
	maxInFlight = 1024
	// dialTimeout bounds one outbound dial; the guest's SYN waits for it.
	dialTimeout = 30 * time.Second
	// tcpBuffer is each way's socket buffer of a guest connection in the
	// stack: the guest is microseconds away, so a window this large keeps
	// the link's 64 KiB segments flowing. It does not grow: whatever a
	// connection holds when one side stops reading is this process's
	// memory, not the guest's (with 8 MiB, a stalled upload held 4 MiB).
	tcpBuffer = 1 << 20
	// DefaultMaxFlows is Config.MaxFlows' default.
	DefaultMaxFlows = 4096
)

// Config configures a Slot.
type Config struct {
	// Path is where the namespace is bound; the runtime joins it.
	Path string
	// HardDeny is what direct traffic may never reach; its Platform holds
	// the host's own addresses (SetHostAddresses replaces them). The slot
	// adds its own prefixes.
	HardDeny netpolicy.HardDeny
	// CheckEndpoint is the dial check on Egress endpoint addresses (the
	// special-purpose ranges less the operator's exemptions), re-run on
	// every dial.
	CheckEndpoint func(netip.Addr) error
	// DeploymentResolvers are the deployment's DNS resolvers, in order. The
	// first one's family selects the link DNS address.
	DeploymentResolvers []netip.AddrPort
	// Changed is called (without locks held) whenever Report would return
	// something new: a confirmation, a drain ending, an observation.
	Changed func()
	// Counters counts the slot's connections and faults; nil counts them
	// in the slot alone.
	Counters *Counters
	// MaxFlows bounds the guest's TCP connections the slot carries at once
	// (each may hold its buffers, up to 2 MiB, in this process); one more
	// is reset. 0 means DefaultMaxFlows.
	MaxFlows int
	// Sockets is the budget of host sockets the slot shares with the
	// host's other slots; a connection over it is reset, a query dropped.
	// nil bounds nothing but the slot's own bounds.
	Sockets *SocketBudget
}

// Slot is one execution's network slot.
type Slot struct {
	cfg Config
	// hard is replaced whole when the host's addresses change.
	hard atomic.Pointer[netpolicy.HardDeny]
	// queues are the files of the TUN device's queues; answers written
	// around the stack go to the first.
	queues []*os.File
	stack  *stack.Stack
	// link serves the queues.
	link *tunLink

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// applied is the application in force, nil until the first Apply
	// succeeds: each new connection decides against one snapshot, read
	// without a lock; it is replaced under mu.
	applied atomic.Pointer[applied]
	// deployment answers DNS at the link address under PUBLIC_INTERNET
	// without a Resolver; nil when no deployment resolver is in the link
	// address's family.
	deployment *dnsforward.Forwarder

	// flows holds a token for each guest TCP connection carried, and
	// exchanges one for each UDP query waiting for its upstream.
	flows, exchanges chan struct{}

	mu      sync.Mutex
	failure string // why the last Apply failed; applied is then nil
	conns   map[*flow]struct{}
	// dnsStreams are the guest's TCP connections to the link DNS address.
	dnsStreams map[*dnsStream]struct{}
	faults     faults
	closed     bool
	// echoes bounds the echo requests being forwarded.
	echoes    chan struct{}
	appliedAt time.Time
}

// Create makes the namespace at cfg.Path and serves it.
func Create(cfg Config) (*Slot, error) {
	queues, err := createNamespace(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("network slot: %w", err)
	}
	s, err := serve(cfg, queues)
	if err != nil {
		destroyNamespace(cfg.Path)
		return nil, err
	}
	return s, nil
}

// Open serves the namespace an earlier process created at cfg.Path (after
// a restart of the host agent). The guest's open connections did not
// survive that process; its link and addresses did.
func Open(cfg Config) (*Slot, error) {
	queues, err := openNamespace(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("network slot: %w", err)
	}
	return serve(cfg, queues)
}

// LinkDNS is the link DNS address a newly started guest's resolv.conf
// names: the gateway in the family of the first deployment resolver (IPv4
// when there is none). The slot answers DNS at the gateway of either
// family (isLinkDNS), so a guest keeps its DNS when its host restarts
// with a first resolver of the other family.
func LinkDNS(resolvers []netip.AddrPort) netip.Addr {
	if len(resolvers) > 0 && resolvers[0].Addr().Unmap().Is6() {
		return linkDNS6
	}
	return linkDNS4
}

// The gateway's addresses, at each of which the slot answers DNS.
var linkDNS4, linkDNS6 = addr(GatewayIPv4), addr(GatewayIPv6)

// isLinkDNS says whether a is a link DNS address.
func isLinkDNS(a netip.Addr) bool { return a == linkDNS4 || a == linkDNS6 }

// ResolvConf is the resolv.conf of a newly started guest: the link DNS
// address is its only nameserver.
func ResolvConf(resolvers []netip.AddrPort) []byte {
	a := LinkDNS(resolvers)
	if a.Is6() {
		// A link-local address needs its link named to be usable.
		a = a.WithZone(ifName)
	}
	return fmt.Appendf(nil, "nameserver %s\n", a)
}

func addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func serve(cfg Config, queues []*os.File) (*Slot, error) {
	st := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	if cfg.Counters == nil {
		cfg.Counters = new(Counters)
	}
	if cfg.MaxFlows == 0 {
		cfg.MaxFlows = DefaultMaxFlows
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Slot{cfg: cfg, queues: queues, stack: st, ctx: ctx, cancel: cancel, conns: map[*flow]struct{}{},
		flows:      make(chan struct{}, cfg.MaxFlows),
		exchanges:  make(chan struct{}, maxDNSExchanges),
		dnsStreams: map[*dnsStream]struct{}{},
		echoes:     make(chan struct{}, maxEchoesInFlight)}
	s.SetHostAddresses(cfg.HardDeny.Platform)
	if up, ok := s.deploymentResolver(); ok {
		s.deployment = &dnsforward.Forwarder{Upstream: dnsforward.Upstream{Protocol: dnsforward.UDP, Address: up},
			Dial: (&net.Dialer{}).DialContext}
	}
	if err := s.setUp(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// SetHostAddresses replaces the host's own addresses among the ranges
// direct traffic never reaches; the host agent calls it whenever they
// change. The DNS cache is cleared: a Resolver reached directly may now be
// out of reach.
func (s *Slot) SetHostAddresses(addrs []netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hard.Store(&netpolicy.HardDeny{Exempt: s.cfg.HardDeny.Exempt,
		Platform: append(append([]netip.Prefix(nil), addrs...), slotPrefixes()...)})
	if a := s.applied.Load(); a != nil {
		a.cache.Clear()
	}
}

// slotPrefixes are the link's own prefixes, which direct traffic never
// reaches: the gateway is this process.
func slotPrefixes() []netip.Prefix {
	return []netip.Prefix{
		netip.PrefixFrom(addr(GuestIPv4), linkPrefix4).Masked(),
		netip.PrefixFrom(addr(GuestIPv6), linkPrefix6).Masked(),
	}
}

func (s *Slot) setUp() error {
	sack := tcpip.TCPSACKEnabled(true)
	// No TIME_WAIT: on a point-to-point link to one guest it protects
	// nothing, and each connection the destination closed first would hold
	// its endpoint for a minute. It still ends on a timer's goroutine; the
	// link guard closes one that a new SYN meets first (endTimeWait).
	timeWait := tcpip.TCPTimeWaitTimeoutOption(0)
	for _, opt := range []tcpip.SettableTransportProtocolOption{
		&sack, &timeWait,
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4096, Default: tcpBuffer, Max: tcpBuffer},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4096, Default: tcpBuffer, Max: tcpBuffer},
	} {
		if err := s.stack.SetTransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			return fmt.Errorf("tcp option: %s", err)
		}
	}
	// The link's readers start when its NIC attaches it.
	link, err := newTUNLink(s.queues)
	if err != nil {
		return err
	}
	s.link = link
	if err := s.stack.CreateNIC(nicID, newLinkGuard(s, link)); err != nil {
		return fmt.Errorf("create NIC: %s", err)
	}
	// Promiscuous and spoofing: the stack accepts packets for every
	// destination and answers from it, so each guest connection ends here.
	if err := s.stack.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("promiscuous mode: %s", err)
	}
	if err := s.stack.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("spoofing: %s", err)
	}
	for _, a := range []struct {
		proto tcpip.NetworkProtocolNumber
		ip    net.IP
		bits  int
	}{{ipv4.ProtocolNumber, GatewayIPv4, linkPrefix4}, {ipv6.ProtocolNumber, GatewayIPv6, 64}} {
		pa := tcpip.ProtocolAddress{Protocol: a.proto,
			AddressWithPrefix: tcpip.AddrFromSlice(a.ip).WithPrefix()}
		pa.AddressWithPrefix.PrefixLen = a.bits
		if err := s.stack.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("add address %s: %s", a.ip, err)
		}
	}
	s.stack.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})
	fwd := tcp.NewForwarder(s.stack, 0, maxInFlight, s.handleTCP)
	s.stack.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	return s.serveDNS()
}

// Path is where the slot's namespace is bound.
func (s *Slot) Path() string { return s.cfg.Path }

// Close stops serving the slot and ends its connections, keeping the
// namespace (Destroy removes it).
func (s *Slot) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := make([]*flow, 0, len(s.conns))
	for f := range s.conns {
		conns = append(conns, f)
	}
	s.mu.Unlock()
	s.cancel()
	for _, f := range conns {
		f.cut()
	}
	if s.link != nil {
		s.link.stop()
	}
	s.stack.RemoveNIC(nicID) // detaches the link before its files close
	s.stack.Close()
	s.wg.Wait()
	s.stack.Wait()
	if s.link != nil {
		s.link.Wait()
	}
	return closeAll(s.queues)
}

// enter counts work that a goroutine the slot does not own starts in it,
// so that Close waits for it (the caller calls s.wg.Done when done); it
// reports false once the slot is closed.
func (s *Slot) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// Destroy closes the slot and releases its namespace.
func (s *Slot) Destroy() error {
	return errors.Join(s.Close(), destroyNamespace(s.cfg.Path))
}

// Release removes a namespace left at path by an execution that no longer
// runs, without serving it.
func Release(path string) error { return destroyNamespace(path) }

// changed tells the owner that the report changed.
func (s *Slot) changed() {
	if s.cfg.Changed != nil {
		s.cfg.Changed()
	}
}

// logger is the slot's logger.
func (s *Slot) logger() *slog.Logger { return slog.With("netns", s.cfg.Path) }
