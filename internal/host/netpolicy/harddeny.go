package netpolicy

import (
	"fmt"
	"net/netip"

	"github.com/kibotos/kibotos/internal/netcheck"
)

// HardDeny is the set of addresses traffic that leaves a slot directly may
// never reach, under every mode and whatever allow says. It is the fixed
// special-purpose set of netcheck (both IANA registries and multicast) less
// Exempt, plus platform ranges that nothing exempts: the built-in ones
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

// platform holds the ranges of every host that no exemption opens.
var platform = []netcheck.Range{
	{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Name: "loopback"},
	{Prefix: netip.MustParsePrefix("::1/128"), Name: "loopback"},
	{Prefix: netip.MustParsePrefix("169.254.0.0/16"), Name: "link-local"},
	{Prefix: netip.MustParsePrefix("fe80::/10"), Name: "link-local"},
	// Linux delivers a connection to the unspecified address to the host
	// itself, as it does one to loopback.
	{Prefix: netip.MustParsePrefix("0.0.0.0/32"), Name: "unspecified"},
	{Prefix: netip.MustParsePrefix("::/128"), Name: "unspecified"},
	// A direct dial to an IPv4-mapped address leaves as IPv4, although
	// allow, deny and egresses matched it as IPv6: reaching it would bypass
	// every IPv4 entry, so no exemption opens it.
	{Prefix: netip.MustParsePrefix("::ffff:0:0/96"), Name: "IPv4-mapped"},
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
	for _, r := range platform {
		if r.Prefix.Contains(a) {
			return true, fmt.Sprintf("%s is in the platform range %s (%s)", a, r.Prefix, r.Name)
		}
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
