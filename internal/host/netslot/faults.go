package netslot

import (
	"errors"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/host/dnsforward"
	"github.com/kibotos/kibotos/internal/host/socks5"
)

// faults are the current runs of failures of the Egresses and Resolver
// entries the slot uses. A run starts with the first failure, stays as it
// was while failures continue, and ends with the next success.
type faults struct {
	egress   map[string]*ctrlv1.EgressObservation
	resolver map[string]*ctrlv1.ResolverObservation
}

// observations returns copies of the current runs in a stable order.
func (f *faults) observations() ([]*ctrlv1.EgressObservation, []*ctrlv1.ResolverObservation) {
	var eo []*ctrlv1.EgressObservation
	for _, o := range f.egress {
		eo = append(eo, proto.CloneOf(o))
	}
	slices.SortFunc(eo, func(a, b *ctrlv1.EgressObservation) int { return strings.Compare(a.EgressId, b.EgressId) })
	var ro []*ctrlv1.ResolverObservation
	for _, o := range f.resolver {
		ro = append(ro, proto.CloneOf(o))
	}
	slices.SortFunc(ro, func(a, b *ctrlv1.ResolverObservation) int { return strings.Compare(a.ResolverId, b.ResolverId) })
	return eo, ro
}

// keepOnly forgets the runs of Egresses and Resolver entries a no longer
// uses: observations describe what the execution forwards through now.
func (f *faults) keepOnly(a *applied) {
	for id := range f.egress {
		if a.egresses[id] == nil {
			delete(f.egress, id)
		}
	}
	for key := range f.resolver {
		if a.resolver == nil || key != a.resolver.key {
			delete(f.resolver, key)
		}
	}
}

// egressResult records the outcome of one use of an Egress: nil is a
// success, an Egress fault starts (or continues) a run, and anything else
// (a destination's own refusal) is neither.
func (s *Slot) egressResult(id string, err error) {
	var kind ctrlv1.EgressObservationKind
	if err != nil {
		var se *socks5.Error
		if !errors.As(err, &se) || !se.EgressFault() {
			return
		}
		kind = egressKind(se.Kind)
		s.cfg.Counters.EgressFaults.Add(kind)
	}
	s.mu.Lock()
	old := s.faults.egress[id]
	switch {
	case err == nil && old == nil, err != nil && old != nil:
		s.mu.Unlock()
		return
	case err == nil:
		delete(s.faults.egress, id)
	default:
		if s.faults.egress == nil {
			s.faults.egress = map[string]*ctrlv1.EgressObservation{}
		}
		s.faults.egress[id] = &ctrlv1.EgressObservation{EgressId: id, Kind: kind,
			FailingSince: timestamppb.New(time.Now()), Error: err.Error()}
	}
	s.mu.Unlock()
	s.changed()
}

// resolverResult records the outcome of one query to the policy's Resolver
// entry: nil (any DNS answer) ends a run, an upstream fault starts one.
func (s *Slot) resolverResult(key string, entry *ctrlv1.NetworkPolicyResolver, err error) {
	var kind ctrlv1.ResolverObservationKind
	if err != nil {
		var de *dnsforward.Error
		if !errors.As(err, &de) {
			return
		}
		kind = resolverKind(de.Kind)
		s.cfg.Counters.ResolverFaults.Add(kind)
	}
	s.mu.Lock()
	old := s.faults.resolver[key]
	switch {
	case err == nil && old == nil, err != nil && old != nil:
		s.mu.Unlock()
		return
	case err == nil:
		delete(s.faults.resolver, key)
	default:
		if s.faults.resolver == nil {
			s.faults.resolver = map[string]*ctrlv1.ResolverObservation{}
		}
		s.faults.resolver[key] = &ctrlv1.ResolverObservation{ResolverId: entry.ResolverId, Path: proto.CloneOf(entry.Path),
			Kind: kind, FailingSince: timestamppb.New(time.Now()), Error: err.Error()}
	}
	s.mu.Unlock()
	s.changed()
}

// resolverKey identifies a Resolver entry by its ID and path.
func resolverKey(e *ctrlv1.NetworkPolicyResolver) string {
	if id := e.GetPath().GetEgressId(); id != "" {
		return e.ResolverId + "@egress:" + id
	}
	return e.ResolverId + "@direct"
}

func egressKind(k socks5.Kind) ctrlv1.EgressObservationKind {
	switch k {
	case socks5.EndpointUnreachable:
		return ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_ENDPOINT_UNREACHABLE
	case socks5.TLSVerificationFailed:
		return ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_TLS_VERIFICATION_FAILED
	case socks5.AuthenticationFailed:
		return ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_AUTHENTICATION_FAILED
	case socks5.UDPAssociationFailed:
		return ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_UDP_ASSOCIATION_FAILED
	}
	return ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_HANDSHAKE_FAILED
}

func resolverKind(k dnsforward.Kind) ctrlv1.ResolverObservationKind {
	switch k {
	case dnsforward.UpstreamTimeout:
		return ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_UPSTREAM_TIMEOUT
	case dnsforward.TLSVerificationFailed:
		return ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_TLS_VERIFICATION_FAILED
	case dnsforward.HTTPErrorStatus:
		return ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_HTTP_ERROR_STATUS
	}
	return ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_UPSTREAM_UNREACHABLE
}
