package netcheck

import (
	"fmt"
	"net/netip"
	"strings"
)

// CanonicalPrefix parses one entry of a NetworkPolicy allow, deny or
// destinations list: one address or one CIDR in canonical text, with no host
// bits set in a CIDR, no leading zeros, IPv6 in compressed lowercase form and
// no zone. Canonical text is exactly what net/netip renders, so an
// IPv4-mapped IPv6 address is written "::ffff:1.2.3.4". A bare address
// becomes a /32 or /128 prefix.
func CanonicalPrefix(s string) (netip.Prefix, error) {
	var p netip.Prefix
	var canonical string
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR", s)
		}
		if m := p.Masked(); m != p {
			return netip.Prefix{}, fmt.Errorf("CIDR %q has host bits set; the network is %s", s, m)
		}
		canonical = p.String()
	} else {
		addr, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR", s)
		}
		if addr.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("address %q must not have a zone", s)
		}
		p, canonical = netip.PrefixFrom(addr, addr.BitLen()), addr.String()
	}
	if s != canonical {
		return netip.Prefix{}, fmt.Errorf("%q is not in canonical form; write %q", s, canonical)
	}
	return p, nil
}

// ParseExemptRanges parses the comma-separated value of the
// --unsafe-exempt-ranges flag: entries in the text of CanonicalPrefix,
// optionally surrounded by spaces. IPv4 ranges must be written as IPv4,
// since addresses are judged unmapped. The empty string exempts nothing.
func ParseExemptRanges(s string) ([]netip.Prefix, error) {
	if s == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		p, err := CanonicalPrefix(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("exempt range %s is IPv4-mapped; write it as IPv4", p)
		}
		out = append(out, p)
	}
	return out, nil
}
