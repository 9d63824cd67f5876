package netcheck

import (
	"net/netip"
	"slices"
	"testing"
)

func TestCanonicalPrefix(t *testing.T) {
	valid := []struct{ in, want string }{
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"::/0", "::/0"},
		{"93.184.215.14", "93.184.215.14/32"},
		{"93.184.215.14/32", "93.184.215.14/32"},
		{"2001:db8::/32", "2001:db8::/32"},
		{"2001:db8::1", "2001:db8::1/128"},
		{"2001:db8:0:1::/64", "2001:db8:0:1::/64"},
		{"fe80::/10", "fe80::/10"},
		{"::1", "::1/128"},
		{"::ffff:1.2.3.4", "::ffff:1.2.3.4/128"},
		{"::ffff:0.0.0.0/96", "::ffff:0.0.0.0/96"},
	}
	for _, tt := range valid {
		got, err := CanonicalPrefix(tt.in)
		if err != nil || got != netip.MustParsePrefix(tt.want) {
			t.Errorf("CanonicalPrefix(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}

	invalid := []string{
		"",
		"/8",
		"10.0.0.0/",
		"10.0.0.0/33",
		"10.0.0.0/-1",
		"10.0.0.0/+8",
		"10.0.0.0/08",
		"10.0.0.1/8",
		"010.0.0.0/8",
		"10.0.0.00",
		"10.0.0",
		" 10.0.0.0/8",
		"10.0.0.0/8 ",
		"2001:DB8::/32",
		"2001:0db8::/32",
		"2001:db8:0:0::/64",
		"2001:db8::1/32",
		"2001:db8:0:0:0:0:0:1",
		"0:0:0:0:0:0:0:1",
		"fe80::1%eth0",
		"fe80::/10%eth0",
		"::ffff:0:0/96",
		"::ffff:102:304",
		"::1.2.3.4",
		"[::1]",
		"example.com",
		"10.0.0.0/8,10.1.0.0/16",
	}
	for _, in := range invalid {
		if got, err := CanonicalPrefix(in); err == nil {
			t.Errorf("CanonicalPrefix(%q) = %s; want an error", in, got)
		}
	}
}

func TestCanonicalPrefixMessages(t *testing.T) {
	tests := []struct{ in, want string }{
		{"10.0.0.1/8", `CIDR "10.0.0.1/8" has host bits set; the network is 10.0.0.0/8`},
		{"2001:DB8::/32", `"2001:DB8::/32" is not in canonical form; write "2001:db8::/32"`},
		{"fe80::1%eth0", `address "fe80::1%eth0" must not have a zone`},
		{"010.0.0.0/8", `"010.0.0.0/8" is not an IP address or CIDR`},
	}
	for _, tt := range tests {
		if _, err := CanonicalPrefix(tt.in); err == nil || err.Error() != tt.want {
			t.Errorf("CanonicalPrefix(%q): got %v, want %s", tt.in, err, tt.want)
		}
	}
}

func TestParseExemptRanges(t *testing.T) {
	valid := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"10.0.0.0/8", []string{"10.0.0.0/8"}},
		{"10.0.0.0/8,fd00::/8,192.168.1.10", []string{"10.0.0.0/8", "fd00::/8", "192.168.1.10/32"}},
		{"10.0.0.0/8, 172.16.0.0/12", []string{"10.0.0.0/8", "172.16.0.0/12"}},
	}
	for _, tt := range valid {
		got, err := ParseExemptRanges(tt.in)
		var want []netip.Prefix
		for _, s := range tt.want {
			want = append(want, netip.MustParsePrefix(s))
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseExemptRanges(%q) = %v, %v; want %v", tt.in, got, err, want)
		}
	}
	for _, in := range []string{",", "10.0.0.0/8,", "10.0.0.1/8", "10.0.0.0/8;fd00::/8", "::ffff:10.0.0.0/104", " "} {
		if got, err := ParseExemptRanges(in); err == nil {
			t.Errorf("ParseExemptRanges(%q) = %v; want an error", in, got)
		}
	}
}
