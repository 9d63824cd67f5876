// Package netpolicy decides, for each new connection a guest opens, what its
// network slot does with it under the Workspace's NetworkPolicy: refuse it,
// let it leave directly, forward it through an Egress, or answer it with
// "administratively prohibited". It is pure: it reads netip values and a
// compiled policy and does no I/O.
//
// DNS queries to the link DNS address never reach this package: the slot
// answers them itself, and allow, deny and egresses never act on them.
package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// Mode is the egress posture of a Policy.
type Mode int

const (
	// DenyAll refuses every connection. It is the zero value, so a Policy
	// nobody filled in admits nothing.
	DenyAll Mode = iota
	// PublicInternet admits guest-initiated TCP and ICMP echo to public
	// destinations over IPv4 and IPv6, narrowed by allow and deny and partly
	// sent through an Egress.
	PublicInternet
)

// String returns the name the API uses for m.
func (m Mode) String() string {
	switch m {
	case DenyAll:
		return "DENY_ALL"
	case PublicInternet:
		return "PUBLIC_INTERNET"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Policy is a NetworkPolicy compiled for evaluation. Its prefix lists keep
// the order of the stored policy; they are matched as sets. A nil *Policy
// is DENY_ALL.
type Policy struct {
	// Revision is the revision of the stored policy, for status reports.
	Revision uint64
	Mode     Mode
	// Allow and Deny narrow PublicInternet. Each prefix acts only on its own
	// address family: an IPv4-mapped IPv6 prefix matches only IPv4-mapped
	// IPv6 destinations, never IPv4 ones.
	Allow, Deny []netip.Prefix
	// Egress is the policy's one egresses entry, or nil when it has none.
	Egress *EgressRule
}

// EgressRule is the egresses entry of a Policy: new TCP connections to
// Destinations leave through the Egress named EgressID.
type EgressRule struct {
	EgressID     string
	Destinations []netip.Prefix
}

// Compile turns a stored NetworkPolicy into a Policy. An unspecified mode
// selects DENY_ALL, and a nil policy is DENY_ALL. The resolvers entries are
// not compiled: they steer DNS queries, which Decide never sees.
//
// The stored policy has been validated, yet Compile checks again what its
// decisions rely on and returns an error rather than guess: an unknown mode,
// entries under DENY_ALL, an entry that is not in canonical text, more than
// one egresses entry, and an egresses entry without an Egress ID or without
// destinations.
func Compile(p *ctrlv1.NetworkPolicy) (*Policy, error) {
	out := &Policy{Revision: p.GetRevision()}
	switch p.GetMode() {
	case ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_UNSPECIFIED, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL:
		if len(p.GetAllow())+len(p.GetDeny())+len(p.GetEgresses())+len(p.GetResolvers()) > 0 {
			return nil, errors.New("network policy: DENY_ALL has allow, deny, egresses or resolvers entries")
		}
		return out, nil
	case ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET:
		out.Mode = PublicInternet
	default:
		return nil, fmt.Errorf("network policy: unknown mode %d", p.GetMode())
	}
	var err error
	if out.Allow, err = prefixes("allow", p.GetAllow()); err != nil {
		return nil, err
	}
	if out.Deny, err = prefixes("deny", p.GetDeny()); err != nil {
		return nil, err
	}
	switch egresses := p.GetEgresses(); len(egresses) {
	case 0:
	case 1:
		e := egresses[0]
		if e.GetEgressId() == "" {
			return nil, errors.New("network policy: egresses[0] names no Egress")
		}
		if len(e.GetDestinations()) == 0 {
			return nil, fmt.Errorf("network policy: egresses[0] (Egress %s) has no destinations", e.GetEgressId())
		}
		dst, err := prefixes("egresses[0].destinations", e.GetDestinations())
		if err != nil {
			return nil, err
		}
		out.Egress = &EgressRule{EgressID: e.GetEgressId(), Destinations: dst}
	default:
		return nil, fmt.Errorf("network policy: %d egresses entries; at most one is accepted", len(egresses))
	}
	return out, nil
}

func prefixes(field string, entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range entries {
		p, err := netcheck.CanonicalPrefix(s)
		if err != nil {
			return nil, fmt.Errorf("network policy: %s[%d]: %w", field, i, err)
		}
		out = append(out, p)
	}
	return out, nil
}
