package netpolicy

import (
	"net/netip"
	"strings"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/netcheck"
)

const (
	denyAllMode = ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL
	publicMode  = ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET
)

func mustCompile(t *testing.T, p *ctrlv1.NetworkPolicy) *Policy {
	t.Helper()
	c, err := Compile(p)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return c
}

func egress(id string, destinations ...string) []*ctrlv1.NetworkPolicyEgress {
	return []*ctrlv1.NetworkPolicyEgress{{EgressId: id, Destinations: destinations}}
}

// prefixesOf parses entries in the text of CanonicalPrefix.
func prefixesOf(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netcheck.CanonicalPrefix(s)
		if err != nil {
			panic(err)
		}
		out = append(out, p)
	}
	return out
}

func TestDecide(t *testing.T) {
	policies := map[string]*Policy{
		"nil":     nil,
		"zero":    {},
		"denyAll": mustCompile(t, &ctrlv1.NetworkPolicy{Mode: denyAllMode, Revision: 3}),
		"unspec":  mustCompile(t, &ctrlv1.NetworkPolicy{}),
		"open":    mustCompile(t, &ctrlv1.NetworkPolicy{Mode: publicMode}),
		// allow carves exceptions out of deny; the Egress covers private,
		// documentation, loopback and IPv4-mapped destinations.
		"narrow": mustCompile(t, &ctrlv1.NetworkPolicy{
			Mode:  publicMode,
			Allow: []string{"1.1.1.1", "10.20.0.0/16", "2606:4700:4700::1111", "192.168.1.0/24", "::ffff:9.9.9.9"},
			Deny:  []string{"1.1.0.0/16", "10.0.0.0/8", "2606:4700::/32", "192.168.0.0/16", "8.8.8.8", "::ffff:0.0.0.0/96"},
			Egresses: egress("eg-corp", "10.0.0.0/8", "172.16.0.0/12", "8.8.8.8", "9.9.9.0/24",
				"fd00::/8", "2001:db8:1::/48", "127.0.0.1", "::ffff:9.9.9.9"),
		}),
		"v4closed": mustCompile(t, &ctrlv1.NetworkPolicy{Mode: publicMode, Allow: []string{"1.1.1.1"}, Deny: []string{"0.0.0.0/0"}}),
		"v6closed": mustCompile(t, &ctrlv1.NetworkPolicy{Mode: publicMode, Deny: []string{"::/0"}}),
		"egressAll": mustCompile(t, &ctrlv1.NetworkPolicy{
			Mode:     publicMode,
			Egresses: egress("eg-all", "0.0.0.0/0", "::/0"),
		}),
	}
	hards := map[string]*HardDeny{
		"nil": nil,
		// The exemptions also name platform ranges, which they must not open.
		"host": {
			Exempt: prefixesOf("198.51.100.0/24", "100.64.0.0/10", "0.0.0.0/8", "2001:db8::/32", "fd7a:115c::/32",
				"127.0.0.0/8", "169.254.0.0/16", "::1", "fe80::/10"),
			Platform: prefixesOf("100.64.7.0/24", "fd7a:115c:a1e0::/64", "5.6.7.8", "2a01:4f8::5"),
		},
		"v6exempt": {Exempt: prefixesOf("::/0")},
	}
	const (
		v4pub = "93.184.215.14"
		v6pub = "2606:2800:21f:cb07:6820:80da:af6b:8b2c"
	)

	tests := []struct {
		pol, hard string
		proto     Protocol
		dst       string // empty for the invalid Addr
		want      Action
		egress    string // for Forward
		why       string // a substring of the Reason of Refuse and Prohibit
	}{
		// DENY_ALL refuses everything, whatever the protocol or family.
		{"denyAll", "host", TCP, v4pub, Refuse, "", "DENY_ALL"},
		{"denyAll", "host", ICMPEcho, v4pub, Refuse, "", "DENY_ALL"},
		{"denyAll", "host", TCP, v6pub, Refuse, "", "DENY_ALL"},
		{"denyAll", "host", UDP, v4pub, Refuse, "", "DENY_ALL"},
		{"unspec", "host", TCP, v4pub, Refuse, "", "DENY_ALL"},
		{"zero", "host", TCP, v6pub, Refuse, "", "DENY_ALL"},
		{"nil", "host", ICMPEcho, v4pub, Refuse, "", "DENY_ALL"},

		// PUBLIC_INTERNET: TCP and ICMP echo to public destinations, both families.
		{"open", "host", TCP, v4pub, Direct, "", ""},
		{"open", "host", ICMPEcho, v4pub, Direct, "", ""},
		{"open", "host", TCP, v6pub, Direct, "", ""},
		{"open", "host", ICMPEcho, v6pub, Direct, "", ""},
		{"open", "host", UDP, v4pub, Refuse, "", "not UDP"},
		{"open", "host", UDP, v6pub, Refuse, "", "not UDP"},
		{"open", "host", Protocol(7), v4pub, Refuse, "", "not Protocol(7)"},
		{"open", "host", TCP, "", Refuse, "", "invalid"},

		// The special-purpose ranges, unless exempt.
		{"open", "host", TCP, "10.1.2.3", Refuse, "", "10.0.0.0/8 (Private-Use)"},
		{"open", "host", TCP, "172.16.0.1", Refuse, "", "172.16.0.0/12"},
		{"open", "host", ICMPEcho, "192.168.1.1", Refuse, "", "192.168.0.0/16"},
		{"open", "host", TCP, "203.0.113.7", Refuse, "", "203.0.113.0/24"},
		{"open", "host", TCP, "224.0.0.251", Refuse, "", "Multicast"},
		{"open", "host", TCP, "255.255.255.255", Refuse, "", "Limited Broadcast"},
		{"open", "host", TCP, "fd12:3456::1", Refuse, "", "fc00::/7"},
		{"open", "host", TCP, "ff02::fb", Refuse, "", "Multicast"},
		{"open", "host", TCP, "64:ff9b::808:808", Refuse, "", "64:ff9b::/96"},
		{"open", "host", TCP, "2002:c000:204::1", Refuse, "", "6to4"},
		{"open", "host", TCP, "198.51.100.7", Direct, "", ""},
		{"open", "host", TCP, "100.100.1.1", Direct, "", ""},
		{"open", "host", TCP, "0.1.2.3", Direct, "", ""},
		{"open", "host", TCP, "2001:db8::1", Direct, "", ""},
		{"open", "host", TCP, "fd7a:115c:beef::5", Direct, "", ""},
		{"open", "nil", TCP, "198.51.100.7", Refuse, "", "Documentation"},
		{"open", "nil", TCP, "10.1.2.3", Refuse, "", "Private-Use"},
		{"open", "nil", TCP, v4pub, Direct, "", ""},
		{"open", "v6exempt", TCP, "fd12:3456::1", Direct, "", ""},

		// Platform ranges: no exemption opens them.
		{"open", "host", TCP, "127.0.0.1", Refuse, "", "platform range 127.0.0.0/8 (loopback)"},
		{"open", "host", ICMPEcho, "127.255.255.254", Refuse, "", "loopback"},
		{"open", "host", TCP, "::1", Refuse, "", "platform range ::1/128 (loopback)"},
		{"open", "host", TCP, "169.254.169.254", Refuse, "", "link-local"},
		{"open", "host", TCP, "fe80::1", Refuse, "", "link-local"},
		{"open", "host", TCP, "fe80::1%eth0", Refuse, "", "platform range fe80::/10"},
		{"open", "host", TCP, "0.0.0.0", Refuse, "", "unspecified"},
		{"open", "host", TCP, "::", Refuse, "", "unspecified"},
		{"open", "host", TCP, "100.64.7.5", Refuse, "", "platform range 100.64.7.0/24"},
		{"open", "host", TCP, "fd7a:115c:a1e0::5", Refuse, "", "platform range fd7a:115c:a1e0::/64"},
		{"open", "host", TCP, "5.6.7.8", Refuse, "", "platform range 5.6.7.8/32"},
		{"open", "host", TCP, "5.6.7.9", Direct, "", ""},
		{"open", "host", ICMPEcho, "2a01:4f8::5", Refuse, "", "platform range 2a01:4f8::5/128"},
		{"open", "v6exempt", TCP, "::1", Refuse, "", "loopback"},

		// IPv4-mapped destinations never leave directly: the dial would
		// leave as IPv4.
		{"open", "host", TCP, "::ffff:" + v4pub, Refuse, "", "IPv4-mapped"},
		{"open", "host", TCP, "::ffff:127.0.0.1", Refuse, "", "IPv4-mapped"},
		{"open", "v6exempt", TCP, "::ffff:" + v4pub, Refuse, "", "IPv4-mapped"},

		// allow beats deny; deny alone refuses, also what the Egress covers.
		{"narrow", "host", TCP, "1.1.1.1", Direct, "", ""},
		{"narrow", "host", ICMPEcho, "1.1.1.1", Direct, "", ""},
		{"narrow", "host", TCP, "1.1.2.2", Refuse, "", "deny entry 1.1.0.0/16"},
		{"narrow", "host", ICMPEcho, "1.1.2.2", Refuse, "", "deny entry 1.1.0.0/16"},
		{"narrow", "host", TCP, "2606:4700:4700::1111", Direct, "", ""},
		{"narrow", "host", TCP, "2606:4700::6810:84e5", Refuse, "", "deny entry 2606:4700::/32"},
		{"narrow", "host", TCP, "10.30.1.1", Refuse, "", "deny entry 10.0.0.0/8"},
		{"narrow", "host", ICMPEcho, "10.30.1.1", Refuse, "", "deny entry 10.0.0.0/8"},
		{"narrow", "host", TCP, "8.8.8.8", Refuse, "", "deny entry 8.8.8.8/32"},
		{"narrow", "host", TCP, "192.168.2.7", Refuse, "", "deny entry 192.168.0.0/16"},
		{"narrow", "host", UDP, "1.1.1.1", Refuse, "", "not UDP"},

		// The Egress: TCP forwarded without the hard deny, ICMP echo prohibited.
		{"narrow", "host", TCP, "10.20.1.1", Forward, "eg-corp", ""},
		{"narrow", "host", ICMPEcho, "10.20.1.1", Prohibit, "", "Egress eg-corp"},
		{"narrow", "host", TCP, "172.16.5.5", Forward, "eg-corp", ""},
		{"narrow", "host", ICMPEcho, "172.16.5.5", Prohibit, "", "Egress eg-corp"},
		{"narrow", "host", UDP, "172.16.5.5", Refuse, "", "not UDP"},
		{"narrow", "host", TCP, "9.9.9.9", Forward, "eg-corp", ""},
		{"narrow", "host", ICMPEcho, "9.9.9.9", Prohibit, "", "ICMP echo to 9.9.9.9"},
		{"narrow", "host", TCP, "fd00::1", Forward, "eg-corp", ""},
		{"narrow", "host", ICMPEcho, "fd00::1", Prohibit, "", "Egress eg-corp"},
		{"narrow", "host", TCP, "2001:db8:1::5", Forward, "eg-corp", ""},
		{"narrow", "host", TCP, "127.0.0.1", Forward, "eg-corp", ""},
		{"narrow", "nil", TCP, "127.0.0.1", Forward, "eg-corp", ""},

		// What the Egress does not cover leaves directly, where the hard deny
		// beats allow.
		{"narrow", "host", TCP, v4pub, Direct, "", ""},
		{"narrow", "host", TCP, v6pub, Direct, "", ""},
		{"narrow", "host", TCP, "2001:db8:2::5", Direct, "", ""},
		{"narrow", "host", TCP, "192.168.1.7", Refuse, "", "hard deny: 192.168.1.7 is in the special-purpose range"},
		{"narrow", "host", TCP, "127.0.0.2", Refuse, "", "hard deny: 127.0.0.2 is in the platform range"},
		{"narrow", "host", TCP, "fc00::1", Refuse, "", "hard deny"},

		// Mapped destinations are IPv6 to allow, deny and egresses.
		{"narrow", "host", TCP, "::ffff:9.9.9.9", Forward, "eg-corp", ""},
		{"narrow", "host", TCP, "::ffff:1.1.1.1", Refuse, "", "deny entry ::ffff:0.0.0.0/96"},
		{"narrow", "host", TCP, "::ffff:10.20.1.1", Refuse, "", "deny entry ::ffff:0.0.0.0/96"},

		// Each entry acts only on its own family.
		{"v4closed", "host", TCP, v4pub, Refuse, "", "deny entry 0.0.0.0/0"},
		{"v4closed", "host", ICMPEcho, v4pub, Refuse, "", "deny entry 0.0.0.0/0"},
		{"v4closed", "host", TCP, "1.1.1.1", Direct, "", ""},
		{"v4closed", "host", TCP, v6pub, Direct, "", ""},
		{"v4closed", "host", ICMPEcho, v6pub, Direct, "", ""},
		{"v4closed", "host", TCP, "::ffff:" + v4pub, Refuse, "", "hard deny"},
		{"v6closed", "host", TCP, v6pub, Refuse, "", "deny entry ::/0"},
		{"v6closed", "host", TCP, v4pub, Direct, "", ""},
		{"v6closed", "host", TCP, "::ffff:" + v4pub, Refuse, "", "deny entry ::/0"},

		// An Egress covering everything forwards every TCP destination.
		{"egressAll", "host", TCP, "10.1.2.3", Forward, "eg-all", ""},
		{"egressAll", "host", TCP, "169.254.169.254", Forward, "eg-all", ""},
		{"egressAll", "host", TCP, "::1", Forward, "eg-all", ""},
		{"egressAll", "host", TCP, "::ffff:" + v4pub, Forward, "eg-all", ""},
		{"egressAll", "host", TCP, "fe80::1%eth0", Forward, "eg-all", ""},
		{"egressAll", "host", ICMPEcho, v6pub, Prohibit, "", "Egress eg-all"},
		{"egressAll", "host", UDP, v4pub, Refuse, "", "not UDP"},
		{"egressAll", "host", TCP, "", Refuse, "", "invalid"},
	}
	for _, tt := range tests {
		pol, ok := policies[tt.pol]
		hard, ok2 := hards[tt.hard]
		if !ok || !ok2 {
			t.Fatalf("unknown policy %q or hard deny %q", tt.pol, tt.hard)
		}
		var dst netip.Addr
		if tt.dst != "" {
			dst = netip.MustParseAddr(tt.dst)
		}
		got := pol.Decide(tt.proto, dst, hard)
		name := tt.pol + "/" + tt.hard + " " + tt.proto.String() + " " + tt.dst
		if got.Action != tt.want || got.EgressID != tt.egress {
			t.Errorf("%s: got %+v, want %v %q", name, got, tt.want, tt.egress)
			continue
		}
		switch {
		case tt.why == "" && got.Reason != "":
			t.Errorf("%s: reason %q, want none", name, got.Reason)
		case !strings.Contains(got.Reason, tt.why):
			t.Errorf("%s: reason %q, want it to contain %q", name, got.Reason, tt.why)
		}
	}
	if len(tests) < 60 {
		t.Errorf("%d cases", len(tests))
	}
}

func TestMoved(t *testing.T) {
	base := &ctrlv1.NetworkPolicy{
		Mode:     publicMode,
		Revision: 1,
		Deny:     []string{"1.1.0.0/16", "10.0.0.0/8"},
		Egresses: egress("eg-a", "10.0.0.0/8", "172.16.0.0/12"),
	}
	with := func(change func(p *ctrlv1.NetworkPolicy)) *Policy {
		p := &ctrlv1.NetworkPolicy{Mode: base.Mode, Revision: 2, Deny: base.Deny, Egresses: base.Egresses}
		change(p)
		return mustCompile(t, p)
	}
	from := mustCompile(t, base)
	// 10.1.2.3 is denied, 172.16.1.1 forwarded, the rest direct or hard denied.
	tests := []struct {
		name  string
		to    *Policy
		proto Protocol
		dst   string
		want  bool
	}{
		{"revision only", with(func(*ctrlv1.NetworkPolicy) {}), TCP, "172.16.1.1", false},
		{"revision only direct", with(func(*ctrlv1.NetworkPolicy) {}), TCP, "93.184.215.14", false},
		{"destinations reordered and repeated", with(func(p *ctrlv1.NetworkPolicy) {
			p.Egresses = egress("eg-a", "172.16.0.0/12", "10.0.0.0/8", "172.16.0.0/12")
		}), TCP, "172.16.1.1", false},
		{"egress replaced", with(func(p *ctrlv1.NetworkPolicy) {
			p.Egresses = egress("eg-b", "10.0.0.0/8", "172.16.0.0/12")
		}), TCP, "172.16.1.1", true},
		{"egress replaced, direct stays", with(func(p *ctrlv1.NetworkPolicy) {
			p.Egresses = egress("eg-b", "10.0.0.0/8", "172.16.0.0/12")
		}), TCP, "93.184.215.14", false},
		{"egress removed", with(func(p *ctrlv1.NetworkPolicy) { p.Egresses = nil }), TCP, "172.16.1.1", true},
		{"destination added", with(func(p *ctrlv1.NetworkPolicy) {
			p.Egresses = egress("eg-a", "10.0.0.0/8", "172.16.0.0/12", "93.184.0.0/16")
		}), TCP, "93.184.215.14", true},
		{"destination added elsewhere", with(func(p *ctrlv1.NetworkPolicy) {
			p.Egresses = egress("eg-a", "10.0.0.0/8", "172.16.0.0/12", "93.184.0.0/16")
		}), TCP, "2606:2800:21f:cb07:6820:80da:af6b:8b2c", false},
		{"deny added", with(func(p *ctrlv1.NetworkPolicy) { p.Deny = append(p.Deny, "172.16.0.0/16") }), TCP, "172.16.1.1", true},
		{"deny of the other family added", with(func(p *ctrlv1.NetworkPolicy) { p.Deny = append(p.Deny, "::/0") }), TCP, "172.16.1.1", false},
		{"allow lifts a deny", with(func(p *ctrlv1.NetworkPolicy) { p.Allow = []string{"10.1.0.0/16"} }), TCP, "10.1.2.3", true},
		{"refused for another reason", with(func(p *ctrlv1.NetworkPolicy) { p.Deny = nil; p.Egresses = nil }), TCP, "10.1.2.3", false},
		{"DENY_ALL", mustCompile(t, &ctrlv1.NetworkPolicy{Mode: denyAllMode}), TCP, "93.184.215.14", true},
		{"nil policy", nil, ICMPEcho, "93.184.215.14", true},
	}
	hard := &HardDeny{}
	for _, tt := range tests {
		if got := Moved(from, tt.to, tt.proto, netip.MustParseAddr(tt.dst), hard); got != tt.want {
			t.Errorf("%s: Moved(%s %s) = %v, want %v", tt.name, tt.proto, tt.dst, got, tt.want)
		}
	}
}
