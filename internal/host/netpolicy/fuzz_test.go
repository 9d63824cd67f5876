package netpolicy

import (
	"net/netip"
	"strings"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// entries splits comma-separated policy entries; the empty string is none.
func entries(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// FuzzDecide compiles policies from fuzzed entry text and decides fuzzed
// destinations: an entry Compile accepts is canonical CIDR text, and no
// decision contradicts the entries: a direct one is never hard denied,
// denied or an Egress destination, and a forward one is always an Egress
// destination.
func FuzzDecide(f *testing.F) {
	f.Add("10.0.0.0/8", "0.0.0.0/0,::/0", "198.51.100.0/24", []byte{198, 51, 100, 7}, true)
	f.Add("", "192.0.2.0/24", "2001:db8::/32", []byte{0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, false)
	f.Add("8.8.8.8", "", "", []byte{8, 8, 8, 8}, true)
	f.Add("10.0.0.1/8", "::ffff:0.0.0.0/96", "fe80::/10%eth0", []byte{127, 0, 0, 1}, true)
	hard := &HardDeny{Exempt: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}}
	f.Fuzz(func(t *testing.T, allow, deny, egress string, dstBytes []byte, tcp bool) {
		p := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET,
			Allow: entries(allow), Deny: entries(deny)}
		if egress != "" {
			p.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: "eg", Destinations: entries(egress)}}
		}
		policy, err := Compile(p)
		if err != nil {
			return
		}
		for _, list := range [][]netip.Prefix{policy.Allow, policy.Deny, policy.egressDestinations()} {
			for _, pr := range list {
				if !pr.IsValid() || pr.Masked() != pr || pr.Addr().Zone() != "" {
					t.Fatalf("Compile accepted %s", pr)
				}
			}
		}
		dst, ok := netip.AddrFromSlice(dstBytes)
		if !ok {
			return
		}
		proto := ICMPEcho
		if tcp {
			proto = TCP
		}
		d := policy.Decide(proto, dst, hard)
		_, allowed := covering(policy.Allow, dst)
		_, denied := covering(policy.Deny, dst)
		_, viaEgress := covering(policy.egressDestinations(), dst)
		hardDenied, _ := hard.Denies(dst)
		switch d.Action {
		case Direct:
			if hardDenied || (denied && !allowed) || viaEgress {
				t.Fatalf("%s to %s decided direct under %+v", proto, dst, policy)
			}
		case Forward:
			if !viaEgress || proto != TCP || d.EgressID != "eg" || (denied && !allowed) {
				t.Fatalf("%s to %s decided forward under %+v", proto, dst, policy)
			}
		}
		if Moved(policy, policy, proto, dst, hard) {
			t.Fatalf("%s to %s moved under the same policy", proto, dst)
		}
	})
}

// egressDestinations are the destinations of p's Egress, if any.
func (p *Policy) egressDestinations() []netip.Prefix {
	if p.Egress == nil {
		return nil
	}
	return p.Egress.Destinations
}
