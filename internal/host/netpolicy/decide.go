package netpolicy

import (
	"fmt"
	"net/netip"
)

// Protocol is the kind of a new guest connection.
type Protocol int

const (
	// TCP is a new TCP connection: the guest's SYN.
	TCP Protocol = iota
	// ICMPEcho is an ICMP or ICMPv6 echo request.
	ICMPEcho
	// UDP is the first datagram of a UDP flow.
	UDP
)

// String names p.
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case ICMPEcho:
		return "ICMP echo"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("Protocol(%d)", int(p))
}

// Action is what the slot does with a new guest connection.
type Action int

const (
	// Refuse lets nothing leave the slot for the connection. It is the zero
	// value, so a Decision nobody filled in admits nothing.
	Refuse Action = iota
	// Direct lets the connection leave from the host's own uplink.
	Direct
	// Forward sends the connection through the Egress named in the Decision.
	Forward
	// Prohibit answers at once with ICMP destination unreachable,
	// administratively prohibited, and lets nothing leave the slot.
	Prohibit
)

// String names a.
func (a Action) String() string {
	switch a {
	case Refuse:
		return "refuse"
	case Direct:
		return "direct"
	case Forward:
		return "forward"
	case Prohibit:
		return "prohibit"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Decision is the outcome of Decide for one connection.
type Decision struct {
	Action Action
	// EgressID names the Egress of a Forward decision; it is empty otherwise.
	EgressID string
	// Reason says, for logs, why a Refuse or Prohibit decision was taken; it
	// is empty otherwise.
	Reason string
}

// Decide decides what the slot does with a new guest connection of proto to
// dst, judging direct traffic against hard. A zone on dst is ignored, and an
// IPv4-mapped IPv6 destination is IPv6 to allow, deny and egresses. Under
// PublicInternet, in order:
//
//   - a protocol other than TCP and ICMP echo is refused;
//   - a destination deny covers and allow does not is refused, whichever
//     way it would leave;
//   - a destination the Egress covers is forwarded for TCP, without the hard
//     deny check, and prohibited for ICMP echo;
//   - anything else leaves directly unless hard denies it, even when allow
//     covers it.
//
// DenyAll, a nil Policy and an invalid dst refuse everything. DNS queries to
// the link DNS address are answered by the slot and are never decided here.
func (p *Policy) Decide(proto Protocol, dst netip.Addr, hard *HardDeny) Decision {
	if !dst.IsValid() {
		return refuse("invalid destination address")
	}
	dst = dst.WithZone("")
	if p == nil || p.Mode != PublicInternet {
		return refuse("DENY_ALL admits no connection")
	}
	if proto != TCP && proto != ICMPEcho {
		return refuse(fmt.Sprintf("PUBLIC_INTERNET admits only TCP and ICMP echo, not %s", proto))
	}
	if _, allowed := covering(p.Allow, dst); !allowed {
		if d, denied := covering(p.Deny, dst); denied {
			return refuse(fmt.Sprintf("deny entry %s covers %s", d, dst))
		}
	}
	if e := p.Egress; e != nil {
		if _, ok := covering(e.Destinations, dst); ok {
			if proto == TCP {
				return Decision{Action: Forward, EgressID: e.EgressID}
			}
			return Decision{Action: Prohibit, Reason: fmt.Sprintf("%s to %s, a destination of Egress %s", proto, dst, e.EgressID)}
		}
	}
	if denied, why := hard.Denies(dst); denied {
		return refuse("hard deny: " + why)
	}
	return Decision{Action: Direct}
}

// Moved reports whether a connection of proto to dst that from decided
// would take another path under to: a different Action or Egress. A live
// policy change lets the connections it moves drain on their old path; the
// others keep running. Reasons are not part of the path.
func Moved(from, to *Policy, proto Protocol, dst netip.Addr, hard *HardDeny) bool {
	a, b := from.Decide(proto, dst, hard), to.Decide(proto, dst, hard)
	return a.Action != b.Action || a.EgressID != b.EgressID
}

func refuse(reason string) Decision {
	return Decision{Action: Refuse, Reason: reason}
}

// covering returns the first prefix of list that contains a. Prefixes of the
// other address family never contain it.
func covering(list []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, p := range list {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
