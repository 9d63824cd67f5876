package netcheck

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testutil/fakeresolver"
)

func TestDial(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	// 127.0.0.2 is refused by the check; the mapped 127.0.0.1 is admitted
	// and dialed as IPv4.
	r := fakeresolver.New(map[string][]netip.Addr{
		"svc.example":  {netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("::ffff:127.0.0.1")},
		"deny.example": {netip.MustParseAddr("127.0.0.2")},
	})
	var checked []netip.Addr
	check := func(a netip.Addr) error {
		checked = append(checked, a)
		if a == netip.MustParseAddr("127.0.0.2") {
			return errors.New("not this one")
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	c, a, err := Dial(ctx, r, check, "tcp", "svc.example", port)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if a != netip.MustParseAddr("127.0.0.1") || len(checked) != 2 || checked[1] != a {
		t.Errorf("reached %v after checking %v", a, checked)
	}

	step := func(err error) DialStep {
		var de *DialError
		if !errors.As(err, &de) {
			t.Fatalf("%v is not a *DialError", err)
		}
		return de.Step
	}
	_, _, err = Dial(ctx, r, check, "tcp", "missing.example", port)
	var re *ResolveError
	if step(err) != DialResolve || !errors.As(err, &re) {
		t.Errorf("unknown host: %v", err)
	}
	_, _, err = Dial(ctx, r, check, "tcp", "deny.example", port)
	if step(err) != DialCheck || !strings.Contains(err.Error(), "127.0.0.2: not this one") {
		t.Errorf("every address refused: %v", err)
	}
	// An IP address is not resolved; nothing listens on port 1.
	calls := len(r.Lookups())
	_, _, err = Dial(ctx, r, nil, "tcp", "127.0.0.1", 1)
	if step(err) != DialConnect || len(r.Lookups()) != calls {
		t.Errorf("closed port: %v (resolver calls %d → %d)", err, calls, len(r.Lookups()))
	}
}
