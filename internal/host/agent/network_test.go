package agent

import (
	"net/netip"
	"strings"
	"testing"
)

// TestEgressEndpointNeverTheHost: an Egress endpoint at one of this
// host's own addresses is refused at every dial, a public one too (no
// special-purpose range covers it); only a range the operator exempted
// opens one, as it opens the special-purpose ranges.
func TestEgressEndpointNeverTheHost(t *testing.T) {
	public, other := netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("8.8.4.4")
	a := &Agent{}
	a.ownAddresses.Store(&[]netip.Prefix{netip.PrefixFrom(public, 32), netip.MustParsePrefix("127.0.0.1/32")})
	for _, addr := range []netip.Addr{public, netip.AddrFrom16(public.As16())} {
		if err := a.checkEndpoint(addr); err == nil || !strings.Contains(err.Error(), "an address of this host") {
			t.Errorf("an Egress at the host's own public %s: %v", addr, err)
		}
	}
	if err := a.checkEndpoint(other); err != nil {
		t.Errorf("an Egress at a public address not the host's: %v", err)
	}
	if err := a.checkEndpoint(netip.MustParseAddr("127.0.0.1")); err == nil {
		t.Error("an Egress at the host's loopback: allowed")
	}
	if err := a.checkEndpoint(netip.MustParseAddr("198.51.100.7")); err == nil {
		t.Error("an Egress in a special-purpose range: allowed")
	}

	// The operator's exemption, for local testing, opens its ranges.
	a.cfg.Network.UnsafeExemptRanges = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("198.51.100.0/24")}
	for _, addr := range []string{"127.0.0.1", "198.51.100.7"} {
		if err := a.checkEndpoint(netip.MustParseAddr(addr)); err != nil {
			t.Errorf("an Egress at exempted %s: %v", addr, err)
		}
	}
	if err := a.checkEndpoint(public); err == nil {
		t.Error("an Egress at the host's own public address, another range exempted: allowed")
	}
}
