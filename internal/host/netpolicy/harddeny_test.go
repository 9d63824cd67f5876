package netpolicy

import (
	"net/netip"
	"testing"
)

func TestDenies(t *testing.T) {
	h := &HardDeny{
		Exempt:   prefixesOf("10.0.0.0/8", "127.0.0.0/8", "::/0"),
		Platform: prefixesOf("10.9.0.0/16"),
	}
	tests := []struct {
		addr   string // empty for the invalid Addr
		denied bool
		why    string
	}{
		{"", true, "invalid address"},
		{"93.184.215.14", false, ""},
		{"10.1.2.3", false, ""},
		{"10.9.2.3", true, "10.9.2.3 is in the platform range 10.9.0.0/16"},
		{"127.0.0.1", true, "127.0.0.1 is in the platform range 127.0.0.0/8 (loopback)"},
		{"172.16.0.1", true, "172.16.0.1 is in the special-purpose range 172.16.0.0/12 (Private-Use)"},
		{"fe80::1%eth0", true, "fe80::1 is in the platform range fe80::/10 (link-local)"},
		{"fd00::1", false, ""},
		{"::ffff:10.1.2.3", true, "::ffff:10.1.2.3 is in the platform range ::ffff:0.0.0.0/96 (IPv4-mapped)"},
	}
	for _, tt := range tests {
		var a netip.Addr
		if tt.addr != "" {
			a = netip.MustParseAddr(tt.addr)
		}
		if denied, why := h.Denies(a); denied != tt.denied || why != tt.why {
			t.Errorf("Denies(%s) = %v, %q; want %v, %q", tt.addr, denied, why, tt.denied, tt.why)
		}
	}

	var zero *HardDeny
	for addr, want := range map[string]bool{"93.184.215.14": false, "10.1.2.3": true, "::1": true, "2606:4700::1111": false} {
		if denied, _ := zero.Denies(netip.MustParseAddr(addr)); denied != want {
			t.Errorf("nil HardDeny: Denies(%s) = %v, want %v", addr, denied, want)
		}
	}
}
