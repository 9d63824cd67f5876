package netslot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/dnsforward"
	"github.com/kibotos/kibotos/internal/host/netpolicy"
	"github.com/kibotos/kibotos/internal/host/socks5"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// applied is one application of a NetworkAssignment: immutable once built,
// so a connection decides against one consistent snapshot.
type applied struct {
	network *hostv1.NetworkAssignment
	// given is the message Apply was given, which its caller does not
	// change: the same message again is told at a glance.
	given    *hostv1.NetworkAssignment
	revision uint64
	drain    time.Duration
	policy   *netpolicy.Policy
	egresses map[string]*egressPath
	resolver *resolverPath // nil: the deployment resolvers answer
	// cache holds the answers given at the link DNS address under this
	// application: a change starts with an empty one, so no answer
	// outlives the policy and Resolver that produced it.
	cache *dnsforward.Cache
}

// egressPath is one Egress at one revision.
type egressPath struct {
	id       string
	revision uint64
	drain    time.Duration
	dialer   *socks5.Dialer
}

// resolverPath is the policy's Resolver entry at one revision.
type resolverPath struct {
	id       string
	key      string // resolverKey of the entry
	path     *ctrlv1.ResolverPath
	revision uint64
	drain    time.Duration // of the update that produced revision
	fwd      *dnsforward.Forwarder
}

// Apply puts a network assignment in force: new connections decide
// against it at once; open connections whose path it moves drain. An
// assignment equal to the one in force changes nothing. One that cannot
// be applied leaves the slot refusing new connections and is reported as
// a failure. The caller must not change n afterwards (a new assignment is
// a new message): the host agent applies its assignment every second, and
// the same message is not compared again field by field.
func (s *Slot) Apply(n *hostv1.NetworkAssignment) {
	s.mu.Lock()
	if a := s.applied.Load(); a != nil && (a.given == n || proto.Equal(a.network, n)) {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	a, err := s.build(n)
	s.mu.Lock()
	if err != nil {
		s.applied.Store(nil)
		s.failure = err.Error()
		s.mu.Unlock()
		s.logger().Error("network policy not applied", "err", err)
		s.changed()
		return
	}
	var closeNow []*flow
	for f := range s.conns {
		if f.draining() {
			continue // an earlier change's deadline holds
		}
		if netpolicy.Moved(f.policy, a.policy, netpolicy.TCP, f.dst.Addr(), s.hard.Load()) {
			if f.startDrain(a.drain, func() { s.cutFlow(f) }) {
				closeNow = append(closeNow, f)
			}
			continue
		}
		f.policy, f.policyRevision = a.policy, a.revision
		if f.decision.Action != netpolicy.Forward {
			continue
		}
		if e := a.egresses[f.decision.EgressID]; e != nil && e.revision != f.egressRevision {
			f.egressDraining = true
			if f.startDrain(e.drain, func() { s.cutFlow(f) }) {
				closeNow = append(closeNow, f)
			}
		}
	}
	for st := range s.dnsStreams {
		if st.follow(s, a) {
			st.close()
		}
	}
	s.applied.Store(a)
	s.failure, s.appliedAt = "", time.Now()
	s.faults.keepOnly(a)
	s.mu.Unlock()
	for _, f := range closeNow {
		s.cutFlow(f)
	}
	s.changed()
}

// build turns an assignment into what the slot enforces.
func (s *Slot) build(n *hostv1.NetworkAssignment) (*applied, error) {
	if n == nil || n.Policy == nil {
		return nil, errors.New("the assignment carries no network policy")
	}
	policy, err := netpolicy.Compile(n.Policy)
	if err != nil {
		return nil, err
	}
	a := &applied{network: proto.CloneOf(n), given: n, revision: n.Policy.Revision, drain: seconds(n.DrainSeconds),
		policy: policy, egresses: map[string]*egressPath{}, cache: dnsforward.NewCache()}
	for _, e := range n.Egresses {
		sp := e.GetSpec().GetSocks5()
		if sp == nil {
			return nil, fmt.Errorf("egress %s has no SOCKS5 endpoint", e.EgressId)
		}
		ep := socks5.Endpoint{Address: sp.Address, Username: sp.Username, Password: sp.Password}
		if t := sp.Tls; t != nil {
			ep.TLS = &socks5.TLS{ServerName: t.ServerName, CACertPEM: t.CaCert}
		}
		a.egresses[e.EgressId] = &egressPath{id: e.EgressId, revision: e.Revision, drain: seconds(e.DrainSeconds),
			dialer: &socks5.Dialer{Endpoint: ep, Check: s.cfg.CheckEndpoint}}
	}
	for _, entry := range n.Policy.Resolvers {
		r, err := s.resolverFor(a, entry, n.Resolvers)
		if err != nil {
			return nil, err
		}
		a.resolver = r
	}
	for _, e := range n.Policy.Egresses {
		if a.egresses[e.EgressId] == nil {
			return nil, fmt.Errorf("the policy references egress %s, which the assignment lacks", e.EgressId)
		}
	}
	return a, nil
}

// resolverFor builds the forwarder of the policy's Resolver entry.
func (s *Slot) resolverFor(a *applied, entry *ctrlv1.NetworkPolicyResolver, assigned []*hostv1.ResolverAssignment) (*resolverPath, error) {
	var ra *hostv1.ResolverAssignment
	for _, r := range assigned {
		if r.ResolverId == entry.ResolverId {
			ra = r
		}
	}
	if ra == nil {
		return nil, fmt.Errorf("the policy references resolver %s, which the assignment lacks", entry.ResolverId)
	}
	up, err := upstreamOf(ra.Spec)
	if err != nil {
		return nil, fmt.Errorf("resolver %s: %w", ra.ResolverId, err)
	}
	key := resolverKey(entry)
	r := &resolverPath{id: ra.ResolverId, key: key, path: entry.Path, revision: ra.Revision, drain: seconds(ra.DrainSeconds)}
	fwd := &dnsforward.Forwarder{Upstream: up}
	switch p := entry.Path.GetKind().(type) {
	case *ctrlv1.ResolverPath_Direct:
		fwd.Dial = s.dialChecked
		fwd.Report = func(err error) { s.resolverResult(key, entry, err) }
	case *ctrlv1.ResolverPath_EgressId:
		e := a.egresses[p.EgressId]
		if e == nil {
			return nil, fmt.Errorf("resolver %s goes through egress %s, which the policy does not list", ra.ResolverId, p.EgressId)
		}
		fwd.Dial = e.dialer.DialContext
		fwd.Report = func(err error) {
			var fault interface{ EgressFault() bool }
			if errors.As(err, &fault) && fault.EgressFault() {
				s.egressResult(e.id, err)
				return
			}
			s.egressResult(e.id, nil) // the query went through the Egress
			s.resolverResult(key, entry, err)
		}
	default:
		return nil, fmt.Errorf("resolver %s has no path", ra.ResolverId)
	}
	r.fwd = fwd
	return r, nil
}

// upstreamOf converts a ResolverSpec.
func upstreamOf(spec *ctrlv1.ResolverSpec) (dnsforward.Upstream, error) {
	switch p := spec.GetProtocol().(type) {
	case *ctrlv1.ResolverSpec_Udp:
		return dnsforward.Upstream{Protocol: dnsforward.UDP, Address: p.Udp.Address}, nil
	case *ctrlv1.ResolverSpec_Tcp:
		return dnsforward.Upstream{Protocol: dnsforward.TCP, Address: p.Tcp.Address}, nil
	case *ctrlv1.ResolverSpec_Tls:
		return dnsforward.Upstream{Protocol: dnsforward.TLS, Address: p.Tls.Address,
			ServerName: p.Tls.ServerName, CACertPEM: p.Tls.CaCert}, nil
	case *ctrlv1.ResolverSpec_Https:
		return dnsforward.Upstream{Protocol: dnsforward.HTTPS, URL: p.Https.Url,
			ServerName: p.Https.ServerName, CACertPEM: p.Https.CaCert}, nil
	}
	return dnsforward.Upstream{}, errors.New("no protocol")
}

// dialChecked dials an upstream on the direct path: a hostname is resolved
// here, and every address the hard deny covers, or that the host holds, is
// removed first.
func (s *Slot) dialChecked(ctx context.Context, network, address string) (net.Conn, error) {
	hard := s.hard.Load()
	return netcheck.DialAddress(ctx, nil, func(a netip.Addr) error {
		if deny, why := hard.Denies(a); deny {
			return fmt.Errorf("refused by the dial check: %s", why)
		}
		if err := checkNotHost(a); err != nil {
			return fmt.Errorf("refused by the dial check: %w", err)
		}
		return nil
	}, network, address)
}

func seconds(s uint32) time.Duration { return time.Duration(s) * time.Second }

// current is the application in force, nil before the first.
func (s *Slot) current() *applied { return s.applied.Load() }

// Report is what the slot has in force, for the execution's reports.
func (s *Slot) Report() *hostv1.NetworkReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &hostv1.NetworkReport{FailureMessage: s.failure}
	r.EgressObservations, r.ResolverObservations = s.faults.observations()
	a := s.applied.Load()
	if a == nil {
		return r
	}
	st := &ctrlv1.NetworkPolicyStatus{AppliedRevision: a.revision, AppliedAt: timestamppb.New(s.appliedAt)}
	egressDraining := map[string]uint64{}
	for f := range s.conns {
		if !f.draining() {
			continue
		}
		if f.egressDraining {
			egressDraining[f.decision.EgressID] = minNonZero(egressDraining[f.decision.EgressID], f.egressRevision)
		} else {
			st.DrainingRevision = minNonZero(st.DrainingRevision, f.policyRevision)
		}
	}
	for _, e := range a.network.Policy.Egresses {
		st.Egresses = append(st.Egresses, &ctrlv1.NetworkPolicyEgressStatus{EgressId: e.EgressId,
			AppliedRevision: a.egresses[e.EgressId].revision, DrainingRevision: egressDraining[e.EgressId]})
	}
	if res := a.resolver; res != nil {
		var draining uint64
		for ds := range s.dnsStreams {
			if ds.draining() && ds.resolver.key == res.key {
				draining = minNonZero(draining, ds.resolver.revision)
			}
		}
		st.Resolvers = append(st.Resolvers, &ctrlv1.NetworkPolicyResolverStatus{ResolverId: res.id,
			Path: proto.CloneOf(res.path), AppliedRevision: res.revision, DrainingRevision: draining})
	}
	r.Status = st
	return r
}

func minNonZero(a, b uint64) uint64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}
