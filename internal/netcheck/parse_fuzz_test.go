package netcheck

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseHostPort checks that what ParseHostPort accepts is a port from 1
// to 65535 and a host that is an IP address without zone or a hostname
// that ValidateHost accepts, and that joining them again parses the same.
func FuzzParseHostPort(f *testing.F) {
	for _, s := range []string{
		"proxy.example.com:1080", "192.0.2.1:53", "[2001:db8::1]:853", "[192.0.2.1]:53",
		"1.2.3.010:80", "0x7f000001:80", "host:0", "host:080", "host:65536", "-a.b:1",
		"a..b:1", "[fe80::1%eth0]:53", "host.:53", ":53", "host", "[::1]", "a_b.c:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		host, port, err := ParseHostPort(s)
		if err != nil {
			return
		}
		if port == 0 {
			t.Fatalf("ParseHostPort(%q) accepted port 0", s)
		}
		if err := ValidateHost(host); err != nil {
			t.Fatalf("ParseHostPort(%q) accepted host %q, which ValidateHost refuses: %v", s, host, err)
		}
		if a, err := netip.ParseAddr(host); err == nil && a.Zone() != "" {
			t.Fatalf("ParseHostPort(%q) accepted a zone", s)
		}
		again := net.JoinHostPort(host, strconv.Itoa(int(port)))
		if h, p, err := ParseHostPort(again); err != nil || h != host || p != port {
			t.Fatalf("ParseHostPort(%q) = %q, %d, but %q parses as %q, %d, %v", s, host, port, again, h, p, err)
		}
	})
}

// FuzzParseExemptRanges checks that what ParseExemptRanges accepts is
// canonical, never IPv4-mapped, and parses the same when written again.
func FuzzParseExemptRanges(f *testing.F) {
	for _, s := range []string{
		"", "198.51.100.0/24", "198.51.100.0/24, 2001:db8::/32", " 10.0.0.0/8 ,192.0.2.1",
		"::ffff:10.0.0.0/104", "10.0.0.1/8", "10.0.0.0/8,", ",", "fe80::/10%eth0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ranges, err := ParseExemptRanges(s)
		if err != nil {
			return
		}
		var text []string
		for _, p := range ranges {
			if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" || p.Addr().Is4In6() {
				t.Fatalf("ParseExemptRanges(%q) accepted %s", s, p)
			}
			text = append(text, p.String())
		}
		again, err := ParseExemptRanges(strings.Join(text, ","))
		if err != nil || len(again) != len(ranges) {
			t.Fatalf("ParseExemptRanges(%q) = %v, which written again parses as %v, %v", s, ranges, again, err)
		}
		for i := range again {
			if again[i] != ranges[i] {
				t.Fatalf("ParseExemptRanges(%q) = %v, which written again parses as %v", s, ranges, again)
			}
		}
	})
}
