package netcheck

import (
	"net/netip"
	"testing"
)

func TestSpecialPurposeEntries(t *testing.T) {
	seen := map[netip.Prefix]bool{}
	for _, e := range SpecialPurpose() {
		if e.Prefix != e.Prefix.Masked() {
			t.Errorf("%s has host bits set", e.Prefix)
		}
		if e.Name == "" {
			t.Errorf("%s has no name", e.Prefix)
		}
		if seen[e.Prefix] {
			t.Errorf("%s is listed twice", e.Prefix)
		}
		seen[e.Prefix] = true
	}
	for _, want := range []string{"224.0.0.0/4", "ff00::/8", "255.255.255.255/32", "::ffff:0:0/96", "2001:30::/28"} {
		if !seen[netip.MustParsePrefix(want)] {
			t.Errorf("%s is missing", want)
		}
	}
}

func TestSpecialPurposeIsACopy(t *testing.T) {
	SpecialPurpose()[0] = Range{}
	if SpecialPurpose()[0].Name == "" {
		t.Fatal("changing the returned slice changed the registry")
	}
}

func TestSpecialPurposeRange(t *testing.T) {
	tests := []struct {
		addr   string
		prefix string // empty: not special
		name   string
	}{
		{"0.0.0.0", "0.0.0.0/32", "This host on this network"},
		{"0.1.2.3", "0.0.0.0/8", "This network"},
		{"10.1.2.3", "10.0.0.0/8", "Private-Use"},
		{"100.64.0.1", "100.64.0.0/10", "Shared Address Space"},
		{"100.128.0.1", "", ""},
		{"127.0.0.1", "127.0.0.0/8", "Loopback"},
		{"169.254.169.254", "169.254.0.0/16", "Link Local"},
		{"172.31.255.255", "172.16.0.0/12", "Private-Use"},
		{"172.32.0.0", "", ""},
		{"192.0.0.1", "192.0.0.0/29", "IPv4 Service Continuity Prefix"},
		{"192.0.0.8", "192.0.0.8/32", "IPv4 dummy address"},
		{"192.0.0.9", "192.0.0.9/32", "Port Control Protocol Anycast"},
		{"192.0.0.100", "192.0.0.0/24", "IETF Protocol Assignments"},
		{"192.0.0.171", "192.0.0.171/32", "NAT64/DNS64 Discovery"},
		{"192.0.2.1", "192.0.2.0/24", "Documentation (TEST-NET-1)"},
		{"192.31.196.1", "192.31.196.0/24", "AS112-v4"},
		{"192.52.193.1", "192.52.193.0/24", "AMT"},
		{"192.88.99.1", "192.88.99.0/24", "Deprecated (6to4 Relay Anycast)"},
		{"192.88.99.2", "192.88.99.2/32", "6a44-relay anycast address"},
		{"192.168.1.1", "192.168.0.0/16", "Private-Use"},
		{"192.175.48.1", "192.175.48.0/24", "Direct Delegation AS112 Service"},
		{"198.19.255.255", "198.18.0.0/15", "Benchmarking"},
		{"198.51.100.7", "198.51.100.0/24", "Documentation (TEST-NET-2)"},
		{"203.0.113.7", "203.0.113.0/24", "Documentation (TEST-NET-3)"},
		{"224.0.0.1", "224.0.0.0/4", "Multicast"},
		{"239.255.255.255", "224.0.0.0/4", "Multicast"},
		{"240.0.0.1", "240.0.0.0/4", "Reserved"},
		{"255.255.255.254", "240.0.0.0/4", "Reserved"},
		{"255.255.255.255", "255.255.255.255/32", "Limited Broadcast"},
		{"1.1.1.1", "", ""},
		{"8.8.8.8", "", ""},
		{"223.255.255.255", "", ""},

		{"::", "::/128", "Unspecified Address"},
		{"::1", "::1/128", "Loopback Address"},
		{"::2", "", ""},
		{"64:ff9b::808:808", "64:ff9b::/96", "IPv4-IPv6 Translat."},
		{"64:ff9b:1::1", "64:ff9b:1::/48", "IPv4-IPv6 Translat."},
		{"100::1", "100::/64", "Discard-Only Address Block"},
		{"100:0:0:1::1", "100:0:0:1::/64", "Dummy IPv6 Prefix"},
		{"2001::1", "2001::/32", "TEREDO"},
		{"2001:1::1", "2001:1::1/128", "Port Control Protocol Anycast"},
		{"2001:1::3", "2001:1::3/128", "DNS-SD Service Registration Protocol Anycast Address"},
		{"2001:1::4", "2001::/23", "IETF Protocol Assignments"},
		{"2001:2::1", "2001:2::/48", "Benchmarking"},
		{"2001:3::1", "2001:3::/32", "AMT"},
		{"2001:4:112::1", "2001:4:112::/48", "AS112-v6"},
		{"2001:10::1", "2001:10::/28", "Deprecated (previously ORCHID)"},
		{"2001:20::1", "2001:20::/28", "ORCHIDv2"},
		{"2001:30::1", "2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix"},
		{"2001:1ff::1", "2001::/23", "IETF Protocol Assignments"},
		{"2001:200::1", "", ""},
		{"2001:db8::1", "2001:db8::/32", "Documentation"},
		{"2002:c000:201::1", "2002::/16", "6to4"},
		{"2620:4f:8000::1", "2620:4f:8000::/48", "Direct Delegation AS112 Service"},
		{"3fff:fff::1", "3fff::/20", "Documentation"},
		{"5f00::1", "5f00::/16", "Segment Routing (SRv6) SIDs"},
		{"fd00::1", "fc00::/7", "Unique-Local"},
		{"fe80::1", "fe80::/10", "Link-Local Unicast"},
		{"fe80::1%eth0", "fe80::/10", "Link-Local Unicast"},
		{"ff02::1", "ff00::/8", "Multicast"},
		{"2606:4700:4700::1111", "", ""},

		// IPv4-mapped addresses are judged as the IPv4 address.
		{"::ffff:10.1.2.3", "10.0.0.0/8", "Private-Use"},
		{"::ffff:127.0.0.1", "127.0.0.0/8", "Loopback"},
		{"::ffff:8.8.8.8", "", ""},
	}
	var c Checker
	for _, tt := range tests {
		prefix, name, ok := c.SpecialPurposeRange(netip.MustParseAddr(tt.addr))
		if tt.prefix == "" {
			if ok {
				t.Errorf("%s: got %s (%s), want no range", tt.addr, prefix, name)
			}
			continue
		}
		if !ok || prefix != netip.MustParsePrefix(tt.prefix) || name != tt.name {
			t.Errorf("%s: got %s (%s) %v, want %s (%s)", tt.addr, prefix, name, ok, tt.prefix, tt.name)
		}
	}
	if _, _, ok := c.SpecialPurposeRange(netip.Addr{}); ok {
		t.Error("the invalid Addr is in a range")
	}
}

func TestSpecialPurposeRangeExempt(t *testing.T) {
	c := Checker{Exempt: []netip.Prefix{
		netip.MustParsePrefix("10.1.0.0/16"),
		netip.MustParsePrefix("fd00::/8"),
	}}
	tests := []struct {
		addr    string
		special bool
	}{
		{"10.1.2.3", false},
		{"::ffff:10.1.2.3", false},
		{"10.2.0.1", true},
		{"fd12::1", false},
		{"fc00::1", true},
		{"192.168.0.1", true},
	}
	for _, tt := range tests {
		if _, _, ok := c.SpecialPurposeRange(netip.MustParseAddr(tt.addr)); ok != tt.special {
			t.Errorf("%s: special = %v, want %v", tt.addr, ok, tt.special)
		}
	}
}
