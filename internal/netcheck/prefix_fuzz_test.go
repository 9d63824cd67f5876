package netcheck

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzCanonicalPrefix checks that CanonicalPrefix accepts exactly the text
// net/netip renders: what it accepts round-trips to the same text and is
// masked and zone-less, and every prefix or address netip parses is accepted
// in its rendered form.
func FuzzCanonicalPrefix(f *testing.F) {
	for _, s := range []string{
		"10.0.0.0/8", "0.0.0.0/0", "::/0", "93.184.215.14", "93.184.215.14/32",
		"2001:db8::/32", "2001:db8::1", "fe80::/10", "::1", "::ffff:1.2.3.4",
		"::ffff:0.0.0.0/96", "::ffff:1.2.3.0/120",
		"", "/8", "10.0.0.0/", "10.0.0.0/33", "10.0.0.0/08", "10.0.0.1/8",
		"010.0.0.0/8", " 10.0.0.0/8", "2001:DB8::/32", "2001:0db8::/32",
		"2001:db8:0:0::/64", "fe80::1%eth0", "fe80::/10%eth0", "fe80::%eth0/64",
		"::ffff:0:0/96", "::ffff:102:304", "::1.2.3.4", "[::1]", "example.com",
		"10.0.0.0/8,10.1.0.0/16", "1.2.3.4/32/32", "::%", "1.2.3.4%eth0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := CanonicalPrefix(s)
		if err == nil {
			text := p.Addr().String()
			if strings.Contains(s, "/") {
				text = p.String()
			} else if p.Bits() != p.Addr().BitLen() {
				t.Errorf("CanonicalPrefix(%q) = %s; a bare address must be a full-length prefix", s, p)
			}
			if text != s {
				t.Errorf("CanonicalPrefix(%q) = %s, which renders as %q", s, p, text)
			}
			if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" {
				t.Errorf("CanonicalPrefix(%q) = %s; want a valid, masked, zone-less prefix", s, p)
			}
		}

		if pp, err := netip.ParsePrefix(s); err == nil {
			want := pp.Masked()
			if got, err := CanonicalPrefix(want.String()); err != nil || got != want {
				t.Errorf("CanonicalPrefix(%q) = %s, %v; want %s", want.String(), got, err, want)
			}
		}
		if a, err := netip.ParseAddr(s); err == nil {
			a = a.WithZone("")
			want := netip.PrefixFrom(a, a.BitLen())
			if got, err := CanonicalPrefix(a.String()); err != nil || got != want {
				t.Errorf("CanonicalPrefix(%q) = %s, %v; want %s", a.String(), got, err, want)
			}
		}
	})
}
