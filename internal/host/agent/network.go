package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"
	"google.golang.org/protobuf/proto"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/fdlimit"
	"github.com/kibotos/kibotos/internal/host/netpolicy"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// slotSocketShare is the share of the process's file descriptors that
// the network slots' host sockets may hold together (each listener of the
// process holds at most another quarter), and minSlotSockets the fewest
// whatever the limit.
const (
	slotSocketShare = 4
	minSlotSockets  = 1024
)

// newSlotSockets returns the budget of the slots' host sockets.
func newSlotSockets() *netslot.SocketBudget {
	return netslot.NewSocketBudget(fdlimit.Share(slotSocketShare, minSlotSockets))
}

// NetworkConfig is how a host's network slots reach out.
type NetworkConfig struct {
	// Dir holds the executions' network namespaces.
	Dir string
	// DeploymentResolvers answer guests' DNS under PUBLIC_INTERNET when the
	// policy names no Resolver.
	DeploymentResolvers []netip.AddrPort
	// UnsafeExemptRanges are the operator's exemptions from the
	// special-purpose ranges (for Egress endpoints and direct traffic; never
	// for this host's own addresses).
	UnsafeExemptRanges []netip.Prefix
	// MaxConnections bounds a workspace's TCP connections its slot
	// carries at once; 0 is netslot.DefaultMaxFlows.
	MaxConnections int
}

// hardDeny is what guests' direct traffic never reaches: the special
// purpose ranges (less the exemptions) and this host's own addresses.
func (a *Agent) hardDeny() netpolicy.HardDeny {
	return netpolicy.HardDeny{Exempt: a.cfg.Network.UnsafeExemptRanges, Platform: a.hostAddresses()}
}

// hostAddresses are this host's own addresses, as last found.
func (a *Agent) hostAddresses() []netip.Prefix {
	if p := a.ownAddresses.Load(); p != nil {
		return *p
	}
	addrs := interfaceAddresses()
	a.ownAddresses.CompareAndSwap(nil, &addrs)
	return addrs
}

// interfaceAddresses are the addresses of this host's interfaces.
func interfaceAddresses() []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		slog.Error("listing the host's addresses", "err", err)
		return nil
	}
	var out []netip.Prefix
	for _, ad := range addrs {
		if n, ok := ad.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ip = ip.Unmap()
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}

// watchHostAddresses keeps every slot's list of the host's own addresses
// current, so that an address added later is never reachable directly.
func (a *Agent) watchHostAddresses(ctx context.Context) {
	updates := make(chan netlink.AddrUpdate, 64)
	if err := netlink.AddrSubscribeWithOptions(updates, ctx.Done(), netlink.AddrSubscribeOptions{}); err != nil {
		slog.Error("watching the host's addresses; slots keep those of their start", "err", err)
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-updates:
			if !ok {
				return
			}
			for len(updates) > 0 { // one refresh for a burst
				<-updates
			}
			addrs := interfaceAddresses()
			a.ownAddresses.Store(&addrs)
			for _, s := range a.slots() {
				s.SetHostAddresses(addrs)
			}
		}
	}
}

// closeDeletedEgresses closes, in every slot, the connections still
// draining through an Egress ctrl says was deleted.
func (a *Agent) closeDeletedEgresses(ids []string) {
	if len(ids) == 0 {
		return
	}
	deleted := make(map[string]bool, len(ids))
	for _, id := range ids {
		deleted[id] = true
	}
	for _, s := range a.slots() {
		s.CloseEgresses(deleted)
	}
}

// slots are the network slots of the host's executions, for a change
// every one takes; they are used outside the agent's lock, since a slot
// reports its changes back through the agent.
func (a *Agent) slots() []*netslot.Slot {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*netslot.Slot
	for _, e := range a.execs {
		if s := e.getSlot(); s != nil {
			out = append(out, s)
		}
	}
	return out
}

// checkEndpoint is the dial check of Egress endpoints: the ranges ctrl
// checked them against when they were set, re-checked on every dial, and
// this host's own addresses (a public one is in no special-purpose range),
// so that an Egress cannot make the host connect to its own services for
// a guest. Only the operator's exemptions open either.
func (a *Agent) checkEndpoint(addr netip.Addr) error {
	addr = addr.Unmap()
	c := netcheck.Checker{Exempt: a.cfg.Network.UnsafeExemptRanges}
	if c.Exempted(addr) {
		return nil
	}
	for _, p := range a.hostAddresses() {
		if p.Contains(addr) {
			return fmt.Errorf("%s is an address of this host", addr)
		}
	}
	if p, name, ok := c.SpecialPurposeRange(addr); ok {
		return fmt.Errorf("%s is in the special-purpose range %s (%s)", addr, p, name)
	}
	return nil
}

// netnsPath is where the network namespace of an execution is bound:
// named by the runtime ID that serves it (see pool.go).
func (a *Agent) netnsPath(executionID string) string {
	return filepath.Join(a.cfg.Network.Dir, a.pool.runtimeID(executionID))
}

// slotConfig configures the slot of one execution.
func (e *execution) slotConfig() netslot.Config {
	return netslot.Config{
		Path: e.agent.netnsPath(e.id), HardDeny: e.agent.hardDeny(), CheckEndpoint: e.agent.checkEndpoint,
		DeploymentResolvers: e.agent.cfg.Network.DeploymentResolvers, Changed: e.resendRunning,
		Counters: &e.agent.counters.slots, Sockets: e.agent.slotSockets, MaxFlows: e.agent.cfg.Network.MaxConnections,
	}
}

// createSlot makes a new execution's network slot, releasing a leftover of
// an earlier attempt first.
func (e *execution) createSlot(as *hostv1.Assignment) (*netslot.Slot, error) {
	path := e.agent.netnsPath(e.id)
	if err := netslot.Release(path); err != nil {
		return nil, err
	}
	s, err := netslot.Create(e.slotConfig())
	if err != nil {
		return nil, err
	}
	s.Apply(as.Network)
	e.setSlot(s)
	return s, nil
}

// reopenSlot serves the namespace of an execution adopted after a restart.
func (e *execution) reopenSlot() {
	if _, err := os.Stat(e.agent.netnsPath(e.id)); err != nil {
		slog.Error("an execution adopted running has no network namespace: its guest has no network until it is started again", "execution", e.id, "err", err)
		return
	}
	s, err := netslot.Open(e.slotConfig())
	if err != nil {
		slog.Error("reopening the network slot", "execution", e.id, "err", err)
		return
	}
	e.setSlot(s)
}

// releaseSlot ends the execution's slot and removes its namespace; call it
// once nothing of the execution runs. The execution is then no longer
// served by a pool entry's runtime ID.
func (e *execution) releaseSlot() error {
	e.mu.Lock()
	s := e.slot
	e.slot = nil
	e.mu.Unlock()
	var err error
	if s != nil {
		err = s.Destroy()
	} else if err = netslot.Release(e.agent.netnsPath(e.id)); errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	if err == nil {
		e.agent.pool.dropAlias(e.id)
	}
	return err
}

func (e *execution) setSlot(s *netslot.Slot) {
	e.mu.Lock()
	e.slot = s
	e.mu.Unlock()
}

func (e *execution) getSlot() *netslot.Slot {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.slot
}

// applyNetwork puts the assignment's network in force on a running
// execution (a no-op when it is already).
func (e *execution) applyNetwork(as *hostv1.Assignment) {
	if s := e.getSlot(); s != nil {
		s.Apply(as.Network)
	}
}

// resendRunning re-sends the running execution's report with what its
// slot now has in force (send adds the latest observation of the guest).
func (e *execution) resendRunning() {
	e.reportMu.Lock()
	defer e.reportMu.Unlock()
	as, _ := e.get()
	last := e.lastReport()
	if as == nil || last == nil || last.State != hostv1.ObservedState_OBSERVED_STATE_RUNNING {
		return
	}
	e.send(as, e.withNetwork(proto.CloneOf(last)))
}

// withNetwork adds the slot's state to a RUNNING report.
func (e *execution) withNetwork(r *hostv1.ExecutionReport) *hostv1.ExecutionReport {
	if s := e.getSlot(); s != nil {
		r.Network = s.Report()
	}
	return r
}

// releaseSlotsExcept removes the namespaces of executions that did not
// survive a restart (and of pool entries): those of running, and of any
// the driver does not say have ended (a recovery that failed for one),
// stay, as a running guest's network lives in its namespace.
func (a *Agent) releaseSlotsExcept(ctx context.Context, running []string) {
	entries, err := os.ReadDir(a.cfg.Network.Dir)
	if err != nil {
		return
	}
	for _, ent := range entries {
		if slices.ContainsFunc(running, func(id string) bool { return filepath.Base(a.netnsPath(id)) == ent.Name() }) {
			continue
		}
		// Namespaces are named by runtime ID, which the host's own driver
		// knows.
		if st, err := a.driver.Status(ctx, ent.Name()); !errors.Is(err, runtime.ErrNotFound) && (err != nil || st.Running) {
			slog.Error("keeping the network namespace of an execution that may run", "execution", ent.Name(), "err", err)
			continue
		}
		if err := netslot.Release(a.netnsPath(ent.Name())); err != nil {
			slog.Error("releasing a leftover network namespace", "execution", ent.Name(), "err", err)
		}
	}
}
