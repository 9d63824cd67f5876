package netpolicy

import (
	"fmt"
	"net/netip"

	"github.com/kibotos/kibotos/internal/netcheck"
)

// HardDeny is the set of addresses traffic that leaves a slot directly may
// never reach, under every mode and whatever allow says. It is the fixed
// special-purpose set of netcheck (both IANA registries and multicast) less
// Exempt, plus platform ranges that nothing exempts: netcheck's
// (loopback, link-local, the unspecified addresses, IPv4-mapped IPv6) and
// Platform. Traffic forwarded through an Egress is not subject to it.
//
// The zero value, and a nil *HardDeny, deny the fixed sets and exempt
// nothing.
type HardDeny struct {
	// Exempt lists prefixes whose addresses are taken out of the
	// special-purpose set: the operator's unsafe --unsafe-exempt-ranges, as
	// netcheck.ParseExemptRanges returns them. It never opens a platform
	// range.
	Exempt []netip.Prefix
	// Platform lists further ranges that nothing exempts, such as the
	// slot's own prefixes and the host's interface addresses.
	Platform []netip.Prefix
}

// Denies reports whether a is in the hard deny set and, if so, why. A zone
// is ignored and the invalid Addr is denied. An IPv4-mapped IPv6 address is
// denied by the platform range ::ffff:0:0/96 whatever the IPv4 address it
// maps, so that IPv4 address needs no judging of its own.
func (h *HardDeny) Denies(a netip.Addr) (bool, string) {
	if !a.IsValid() {
		return true, "invalid address"
	}
	a = a.WithZone("")
	var exempt, extra []netip.Prefix
	if h != nil {
		exempt, extra = h.Exempt, h.Platform
	}
	if r, ok := netcheck.PlatformRange(a); ok {
		return true, fmt.Sprintf("%s is in the platform range %s (%s)", a, r.Prefix, r.Name)
	}
	for _, p := range extra {
		if p.Contains(a) {
			return true, fmt.Sprintf("%s is in the platform range %s", a, p)
		}
	}
	c := netcheck.Checker{Exempt: exempt}
	if p, name, ok := c.SpecialPurposeRange(a); ok {
		return true, fmt.Sprintf("%s is in the special-purpose range %s (%s)", a, p, name)
	}
	return false, ""
}
