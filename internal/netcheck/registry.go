// Package netcheck decides whether an endpoint address may be used: it holds
// the fixed IANA special-purpose address registries, checks host:port
// endpoints against them (resolving a hostname once), and parses the
// canonical address and CIDR text of network policies.
package netcheck

import (
	"net/netip"
	"slices"
)

// Range is one entry of the special-purpose set: a prefix and its name in
// the IANA registry.
type Range struct {
	Prefix netip.Prefix
	Name   string
}

// specialPurpose holds every entry of the IANA IPv4 and IPv6
// Special-Purpose Address Registries, plus the multicast blocks, which are
// not unicast destinations. Nested entries are kept: a lookup reports the
// most specific one.
var specialPurpose = []Range{
	// https://www.iana.org/assignments/iana-ipv4-special-registry
	r("0.0.0.0/8", "This network"),
	r("0.0.0.0/32", "This host on this network"),
	r("10.0.0.0/8", "Private-Use"),
	r("100.64.0.0/10", "Shared Address Space"),
	r("127.0.0.0/8", "Loopback"),
	r("169.254.0.0/16", "Link Local"),
	r("172.16.0.0/12", "Private-Use"),
	r("192.0.0.0/24", "IETF Protocol Assignments"),
	r("192.0.0.0/29", "IPv4 Service Continuity Prefix"),
	r("192.0.0.8/32", "IPv4 dummy address"),
	r("192.0.0.9/32", "Port Control Protocol Anycast"),
	r("192.0.0.10/32", "Traversal Using Relays around NAT Anycast"),
	r("192.0.0.170/32", "NAT64/DNS64 Discovery"),
	r("192.0.0.171/32", "NAT64/DNS64 Discovery"),
	r("192.0.2.0/24", "Documentation (TEST-NET-1)"),
	r("192.31.196.0/24", "AS112-v4"),
	r("192.52.193.0/24", "AMT"),
	r("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)"),
	r("192.88.99.2/32", "6a44-relay anycast address"),
	r("192.168.0.0/16", "Private-Use"),
	r("192.175.48.0/24", "Direct Delegation AS112 Service"),
	r("198.18.0.0/15", "Benchmarking"),
	r("198.51.100.0/24", "Documentation (TEST-NET-2)"),
	r("203.0.113.0/24", "Documentation (TEST-NET-3)"),
	r("240.0.0.0/4", "Reserved"),
	r("255.255.255.255/32", "Limited Broadcast"),

	// https://www.iana.org/assignments/iana-ipv6-special-registry
	r("::1/128", "Loopback Address"),
	r("::/128", "Unspecified Address"),
	r("::ffff:0:0/96", "IPv4-mapped Address"),
	r("64:ff9b::/96", "IPv4-IPv6 Translat."),
	r("64:ff9b:1::/48", "IPv4-IPv6 Translat."),
	r("100::/64", "Discard-Only Address Block"),
	r("100:0:0:1::/64", "Dummy IPv6 Prefix"),
	r("2001::/23", "IETF Protocol Assignments"),
	r("2001::/32", "TEREDO"),
	r("2001:1::1/128", "Port Control Protocol Anycast"),
	r("2001:1::2/128", "Traversal Using Relays around NAT Anycast"),
	r("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast Address"),
	r("2001:2::/48", "Benchmarking"),
	r("2001:3::/32", "AMT"),
	r("2001:4:112::/48", "AS112-v6"),
	r("2001:10::/28", "Deprecated (previously ORCHID)"),
	r("2001:20::/28", "ORCHIDv2"),
	r("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix"),
	r("2001:db8::/32", "Documentation"),
	r("2002::/16", "6to4"),
	r("2620:4f:8000::/48", "Direct Delegation AS112 Service"),
	r("3fff::/20", "Documentation"),
	r("5f00::/16", "Segment Routing (SRv6) SIDs"),
	r("fc00::/7", "Unique-Local"),
	r("fe80::/10", "Link-Local Unicast"),

	// Not unicast.
	r("224.0.0.0/4", "Multicast"),
	r("ff00::/8", "Multicast"),
}

func r(prefix, name string) Range {
	return Range{Prefix: netip.MustParsePrefix(prefix), Name: name}
}

// SpecialPurpose returns a copy of the fixed special-purpose set: every
// entry of the IANA IPv4 and IPv6 Special-Purpose Address Registries, plus
// 224.0.0.0/4 and ff00::/8 (multicast).
func SpecialPurpose() []Range {
	return slices.Clone(specialPurpose)
}

// lookup returns the most specific special-purpose range that contains
// addr, which must be valid, unmapped and without a zone.
func lookup(addr netip.Addr) (Range, bool) {
	var best Range
	found := false
	for _, e := range specialPurpose {
		if e.Prefix.Contains(addr) && (!found || e.Prefix.Bits() > best.Prefix.Bits()) {
			best, found = e, true
		}
	}
	return best, found
}

// platformRanges are those of every host that no exemption opens to a
// guest's direct traffic: a connection there reaches the host itself.
var platformRanges = []Range{
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

// PlatformRange returns the platform range that contains addr (its zone
// ignored, an IPv4-mapped address in the IPv4-mapped range), if any.
func PlatformRange(addr netip.Addr) (Range, bool) {
	addr = addr.WithZone("")
	for _, r := range platformRanges {
		if r.Prefix.Contains(addr) {
			return r, true
		}
	}
	return Range{}, false
}
