package agent

import (
	"net/netip"
	"strings"
	"testing"
)

// TestEgressEndpointNeverTheHost: an Egress endpoint at one of this
// host's own addresses is refused at every dial, even where the operator
// exempted its range from the special-purpose checks; another address of
// an exempted range is let through.
func TestEgressEndpointNeverTheHost(t *testing.T) {
	a := &Agent{cfg: Config{Network: NetworkConfig{UnsafeExemptRanges: []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}}}
	own := hostAddresses()
	if len(own) == 0 {
		t.Skip("this host lists no addresses")
	}
	for _, p := range own {
		if err := a.checkEndpoint(p.Addr()); err == nil || !strings.Contains(err.Error(), "an address of this host") {
			t.Errorf("an Egress at the host's own %s: %v", p.Addr(), err)
		}
		if p.Addr().Is4() {
			if err := a.checkEndpoint(netip.AddrFrom16(p.Addr().As16())); err == nil {
				t.Errorf("an Egress at the host's own %s, IPv4-mapped: allowed", p.Addr())
			}
		}
	}
	other := netip.MustParseAddr("198.51.100.77")
	for _, p := range own {
		if p.Contains(other) {
			t.Skipf("this host has %s", other)
		}
	}
	if err := a.checkEndpoint(other); err != nil {
		t.Errorf("an Egress in an exempted range: %v", err)
	}
	a.cfg.Network.UnsafeExemptRanges = nil
	if err := a.checkEndpoint(other); err == nil {
		t.Errorf("an Egress in a special-purpose range without the exemption: allowed")
	}
}
