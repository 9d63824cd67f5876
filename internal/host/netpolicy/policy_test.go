package netpolicy

import (
	"reflect"
	"strings"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

func TestCompile(t *testing.T) {
	valid := []struct {
		name string
		in   *ctrlv1.NetworkPolicy
		want *Policy
	}{
		{"nil", nil, &Policy{}},
		{"unspecified", &ctrlv1.NetworkPolicy{Revision: 4}, &Policy{Revision: 4, Mode: DenyAll}},
		{"DENY_ALL", &ctrlv1.NetworkPolicy{Mode: denyAllMode, Revision: 1}, &Policy{Revision: 1, Mode: DenyAll}},
		{"PUBLIC_INTERNET", &ctrlv1.NetworkPolicy{Mode: publicMode, Revision: 2}, &Policy{Revision: 2, Mode: PublicInternet}},
		{"entries", &ctrlv1.NetworkPolicy{
			Mode:      publicMode,
			Revision:  9,
			Allow:     []string{"1.1.1.1", "2001:db8::/32", "::ffff:9.9.9.9"},
			Deny:      []string{"0.0.0.0/0", "::ffff:0.0.0.0/96", "10.0.0.0/8"},
			Egresses:  egress("eg-1", "172.16.0.0/12", "fd00::/8", "172.16.0.0/12"),
			Resolvers: []*ctrlv1.NetworkPolicyResolver{{ResolverId: "rs-1"}},
		}, &Policy{
			Revision: 9,
			Mode:     PublicInternet,
			Allow:    prefixesOf("1.1.1.1", "2001:db8::/32", "::ffff:9.9.9.9"),
			Deny:     prefixesOf("0.0.0.0/0", "::ffff:0.0.0.0/96", "10.0.0.0/8"),
			Egress:   &EgressRule{EgressID: "eg-1", Destinations: prefixesOf("172.16.0.0/12", "fd00::/8", "172.16.0.0/12")},
		}},
	}
	for _, tt := range valid {
		got, err := Compile(tt.in)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: Compile = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
	// A mapped entry stays IPv6, so it never matches an IPv4 destination.
	p, err := Compile(&ctrlv1.NetworkPolicy{Mode: publicMode, Allow: []string{"::ffff:9.9.9.9"}})
	if err != nil || !p.Allow[0].Addr().Is4In6() {
		t.Errorf("mapped allow entry compiled to %v, %v; want it IPv4-mapped", p, err)
	}

	invalid := []struct {
		name string
		in   *ctrlv1.NetworkPolicy
		want string
	}{
		{"unknown mode", &ctrlv1.NetworkPolicy{Mode: 7}, "unknown mode 7"},
		{"DENY_ALL with allow", &ctrlv1.NetworkPolicy{Mode: denyAllMode, Allow: []string{"1.1.1.1"}}, "DENY_ALL"},
		{"unspecified with deny", &ctrlv1.NetworkPolicy{Deny: []string{"1.1.1.1"}}, "DENY_ALL"},
		{"DENY_ALL with egress", &ctrlv1.NetworkPolicy{Mode: denyAllMode, Egresses: egress("eg-1", "10.0.0.0/8")}, "DENY_ALL"},
		{"DENY_ALL with resolver", &ctrlv1.NetworkPolicy{Mode: denyAllMode, Resolvers: []*ctrlv1.NetworkPolicyResolver{{ResolverId: "rs-1"}}}, "DENY_ALL"},
		{"host bits", &ctrlv1.NetworkPolicy{Mode: publicMode, Allow: []string{"1.1.1.1", "10.0.0.1/8"}}, "allow[1]: CIDR"},
		{"upper case", &ctrlv1.NetworkPolicy{Mode: publicMode, Deny: []string{"2001:DB8::/32"}}, "deny[0]"},
		{"leading zero", &ctrlv1.NetworkPolicy{Mode: publicMode, Deny: []string{"010.0.0.0/8"}}, "deny[0]"},
		{"empty entry", &ctrlv1.NetworkPolicy{Mode: publicMode, Allow: []string{""}}, "allow[0]"},
		{"zone", &ctrlv1.NetworkPolicy{Mode: publicMode, Egresses: egress("eg-1", "10.0.0.0/8", "fe80::1%eth0")}, "egresses[0].destinations[1]"},
		{"hostname", &ctrlv1.NetworkPolicy{Mode: publicMode, Egresses: egress("eg-1", "example.com")}, "egresses[0].destinations[0]"},
		{"two egresses", &ctrlv1.NetworkPolicy{Mode: publicMode, Egresses: append(egress("eg-1", "10.0.0.0/8"), egress("eg-2", "172.16.0.0/12")...)}, "2 egresses entries"},
		{"no egress id", &ctrlv1.NetworkPolicy{Mode: publicMode, Egresses: egress("", "10.0.0.0/8")}, "names no Egress"},
		{"nil egress", &ctrlv1.NetworkPolicy{Mode: publicMode, Egresses: []*ctrlv1.NetworkPolicyEgress{nil}}, "names no Egress"},
		{"no destinations", &ctrlv1.NetworkPolicy{Mode: publicMode, Egresses: egress("eg-1")}, "no destinations"},
	}
	for _, tt := range invalid {
		got, err := Compile(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Compile = %+v, %v; want an error containing %q", tt.name, got, err, tt.want)
		}
	}
}
