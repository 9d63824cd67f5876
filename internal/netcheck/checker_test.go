package netcheck

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testutil/fakeresolver"
)

var _ Resolver = (*net.Resolver)(nil)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestCheckEndpoint(t *testing.T) {
	answers := map[string][]netip.Addr{
		"public.example":   addrs("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"),
		"mixed.example":    addrs("93.184.215.14", "10.9.8.7"),
		"mapped.example":   addrs("::ffff:93.184.215.14"),
		"mapped10.example": addrs("::ffff:10.9.8.7"),
		"local.example":    addrs("fe80::1%eth0"),
		"empty.example":    nil,
		"invalid.example":  {netip.Addr{}},
		"exempt.example":   addrs("10.7.0.5"),
	}
	tests := []struct {
		endpoint string
		want     string // empty: accepted
		kind     string // "range", "resolve" or "syntax"
		lookups  int
	}{
		{"93.184.215.14:1080", "", "", 0},
		{"[2606:4700:4700::1111]:443", "", "", 0},
		{"[::ffff:93.184.215.14]:443", "", "", 0},
		{"10.1.2.3:1080", "address 10.1.2.3 is in the special-purpose range 10.0.0.0/8 (Private-Use)", "range", 0},
		{"10.7.0.7:1080", "", "", 0}, // exempt
		{"127.0.0.1:1080", "address 127.0.0.1 is in the special-purpose range 127.0.0.0/8 (Loopback)", "range", 0},
		{"[::1]:1080", "address ::1 is in the special-purpose range ::1/128 (Loopback Address)", "range", 0},
		{"[::ffff:169.254.169.254]:80", "address 169.254.169.254 is in the special-purpose range 169.254.0.0/16 (Link Local)", "range", 0},
		{"224.0.0.1:80", "address 224.0.0.1 is in the special-purpose range 224.0.0.0/4 (Multicast)", "range", 0},
		{"public.example:1080", "", "", 1},
		{"mapped.example:1080", "", "", 1},
		{"exempt.example:1080", "", "", 1},
		{"mixed.example:1080", `host "mixed.example" resolves to 10.9.8.7, which is in the special-purpose range 10.0.0.0/8 (Private-Use)`, "range", 1},
		{"mapped10.example:1080", `host "mapped10.example" resolves to 10.9.8.7, which is in the special-purpose range 10.0.0.0/8 (Private-Use)`, "range", 1},
		{"local.example:1080", `host "local.example" resolves to fe80::1, which is in the special-purpose range fe80::/10 (Link-Local Unicast)`, "range", 1},
		{"missing.example:1080", `cannot resolve host "missing.example": lookup missing.example: no such host`, "resolve", 1},
		{"empty.example:1080", `cannot resolve host "empty.example": no addresses`, "resolve", 1},
		{"invalid.example:1080", `cannot resolve host "invalid.example": the resolver returned an invalid address`, "resolve", 1},
		{"public.example", "", "syntax", 0},
		{"public.example:0", "", "syntax", 0},
		{"bad_host.example:80", "", "syntax", 0},
		{"[fe80::1%eth0]:80", "", "syntax", 0},
	}
	for _, tt := range tests {
		r := fakeresolver.New(answers)
		c := Checker{Resolver: r, Exempt: []netip.Prefix{netip.MustParsePrefix("10.7.0.0/16")}}
		err := c.CheckEndpoint(context.Background(), tt.endpoint)
		lookups := r.Lookups()
		if len(lookups) != tt.lookups {
			t.Errorf("%s: %d lookups, want %d", tt.endpoint, len(lookups), tt.lookups)
		}
		for _, l := range lookups {
			if l.Network != "ip" || l.Timeout <= 0 || l.Timeout > ResolveTimeout {
				t.Errorf("%s: lookup on %q with deadline %v", tt.endpoint, l.Network, l.Timeout)
			}
		}
		if tt.kind == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.endpoint, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: accepted, want an error", tt.endpoint)
			continue
		}
		if tt.want != "" && err.Error() != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.endpoint, err, tt.want)
		}
		var re *RangeError
		var le *ResolveError
		kind := "syntax"
		switch {
		case errors.As(err, &re):
			kind = "range"
		case errors.As(err, &le):
			kind = "resolve"
		}
		if kind != tt.kind {
			t.Errorf("%s: %s error, want %s: %v", tt.endpoint, kind, tt.kind, err)
		}
	}
}

func TestCheckEndpointResolveError(t *testing.T) {
	dnsErr := &net.DNSError{Err: "server misbehaving", Name: "x.example", IsTemporary: true}
	c := Checker{Resolver: fakeresolver.Failing(dnsErr)}
	err := c.CheckEndpoint(context.Background(), "x.example:80")
	var got *net.DNSError
	if !errors.As(err, &got) || got != dnsErr {
		t.Fatalf("got %v, want the resolver's error wrapped", err)
	}
}

func TestCheckEndpointContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := fakeresolver.New(map[string][]netip.Addr{"public.example": addrs("93.184.215.14")})
	c := Checker{Resolver: r}
	err := c.CheckEndpoint(ctx, "public.example:80")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.CheckEndpoint(ctx, "public.example:80"); err != nil {
		t.Fatal(err)
	}
	lookups := r.Lookups()
	if last := lookups[len(lookups)-1]; last.Timeout > time.Second {
		t.Fatalf("lookup deadline %v is later than the caller's", last.Timeout)
	}
}

func TestCheckEndpointZeroChecker(t *testing.T) {
	var c Checker // IP literals never reach the default resolver
	if err := c.CheckEndpoint(context.Background(), "93.184.215.14:80"); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckEndpoint(context.Background(), "192.168.1.1:80"); err == nil {
		t.Fatal("192.168.1.1 accepted")
	}
}
