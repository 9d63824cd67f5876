package netslot

import (
	"sync/atomic"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Counters count what the slots of a host did. One value is shared by
// every slot of the host (Config.Counters) and outlives them; each count
// is one atomic add, taken once per connection or fault, never per packet.
type Counters struct {
	// Direct, Egress and DNS count the guest TCP connections carried: left
	// directly, forwarded through an Egress, or to the link DNS address.
	Direct, Egress, DNS atomic.Uint64
	// DNSCached, DNSForwarded and DNSLocal count the guest's queries to the
	// link DNS address (over UDP and TCP) by how each was answered: from
	// the slot's cache, through the upstream (SERVFAIL when it failed), or
	// by the slot alone (REFUSED under DENY_ALL, SERVFAIL without a
	// resolver, FORMERR).
	DNSCached, DNSForwarded, DNSLocal atomic.Uint64
	// DNSDropped counts the guest's UDP queries dropped unanswered: the
	// slot had maxDNSExchanges waiting for their upstream, or the host's
	// socket budget was spent.
	DNSDropped atomic.Uint64
	// Refused counts the guest TCP connections the policy refused (reset);
	// Unreachable those the policy admitted whose outbound leg failed (reset
	// too).
	Refused, Unreachable atomic.Uint64
	// Limited counts the guest TCP connections reset because the slot
	// carried its most at once: Config.MaxFlows connections (or the host's
	// socket budget was spent), or maxDNSStreams to the link DNS address.
	Limited atomic.Uint64
	// EgressFaults counts the failed uses of Egresses that were the Egress's
	// fault, by kind; ResolverFaults the failed queries to policy Resolvers,
	// by kind.
	EgressFaults   KindCounts[ctrlv1.EgressObservationKind]
	ResolverFaults KindCounts[ctrlv1.ResolverObservationKind]
}

// KindCounts counts events by the value of one of the API's small enums.
type KindCounts[K ~int32] struct {
	n [16]atomic.Uint64
}

// Add counts one event of kind k; a value past the enum's known range
// counts nowhere.
func (c *KindCounts[K]) Add(k K) {
	if k >= 0 && int(k) < len(c.n) {
		c.n[k].Add(1)
	}
}

// Load returns the events of kind k.
func (c *KindCounts[K]) Load(k K) uint64 {
	if k >= 0 && int(k) < len(c.n) {
		return c.n[k].Load()
	}
	return 0
}
