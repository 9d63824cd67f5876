package netcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// ResolveTimeout bounds the single lookup CheckEndpoint makes for a
// hostname; a shorter deadline on the caller's context still applies.
const ResolveTimeout = 5 * time.Second

// Resolver looks up the addresses of a hostname. *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Checker checks endpoint addresses against the special-purpose set. The
// zero value resolves with net.DefaultResolver and exempts nothing.
type Checker struct {
	// Resolver resolves hostnames; nil selects net.DefaultResolver.
	Resolver Resolver
	// Exempt lists prefixes whose addresses are never refused. It is the
	// operator-only, unsafe --unsafe-exempt-ranges setting.
	Exempt []netip.Prefix
}

// RangeError reports an endpoint address in a special-purpose range.
type RangeError struct {
	Host  string     // the hostname that resolved to Addr; empty for an IP literal
	Addr  netip.Addr // the address as judged: unmapped, without zone
	Range Range
	// Platform is set when Range is a platform range (CheckDirect).
	Platform bool
}

func (e *RangeError) Error() string {
	kind, why := "special-purpose", ""
	if e.Platform {
		kind, why = "platform", ", which no exemption opens to a guest's direct traffic: send it through an Egress"
	}
	if e.Host != "" {
		return fmt.Sprintf("host %q resolves to %s, which is in the %s range %s (%s)%s",
			e.Host, e.Addr, kind, e.Range.Prefix, e.Range.Name, why)
	}
	return fmt.Sprintf("address %s is in the %s range %s (%s)%s", e.Addr, kind, e.Range.Prefix, e.Range.Name, why)
}

// ResolveError reports a hostname that did not resolve to any address.
type ResolveError struct {
	Host string
	Err  error
}

func (e *ResolveError) Error() string {
	return fmt.Sprintf("cannot resolve host %q: %v", e.Host, e.Err)
}

func (e *ResolveError) Unwrap() error { return e.Err }

// CheckEndpoint checks an endpoint written as host:port (see ParseHostPort).
// It returns a syntax error, a *RangeError when the IP literal is in a
// special-purpose range, or, for a hostname resolved once, a *ResolveError
// when the lookup fails or finds nothing and a *RangeError when any resolved
// address is in a special-purpose range. The check only reports a mistake
// early: the answer may differ by the time the endpoint is dialed.
func (c *Checker) CheckEndpoint(ctx context.Context, hostport string) error {
	return c.checkEndpoint(ctx, hostport, false)
}

// CheckDirect is CheckEndpoint for an endpoint that a guest's traffic
// reaches directly from its slot (a Resolver's direct path): it also
// refuses the platform ranges (PlatformRange), exempt or not.
func (c *Checker) CheckDirect(ctx context.Context, hostport string) error {
	return c.checkEndpoint(ctx, hostport, true)
}

func (c *Checker) checkEndpoint(ctx context.Context, hostport string, direct bool) error {
	host, _, err := ParseHostPort(hostport)
	if err != nil {
		return err
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		return c.check("", addr, direct)
	}
	addrs, err := c.resolve(ctx, host)
	if err != nil {
		return err
	}
	for _, addr := range addrs {
		if err := c.check(host, addr, direct); err != nil {
			return err
		}
	}
	return nil
}

// SpecialPurposeRange returns the most specific special-purpose range that
// contains addr and its registry name, or false when there is none or addr
// is in an exempt prefix. A zone is ignored, and an IPv4-mapped IPv6 address
// is judged as the IPv4 address it maps, since a dial to it reaches that
// address. The invalid Addr is in no range.
func (c *Checker) SpecialPurposeRange(addr netip.Addr) (netip.Prefix, string, bool) {
	e, ok := c.lookup(addr)
	return e.Prefix, e.Name, ok
}

func (c *Checker) lookup(addr netip.Addr) (Range, bool) {
	if c.Exempted(addr) {
		return Range{}, false
	}
	return lookup(addr.WithZone("").Unmap())
}

// Exempted reports whether addr (judged as SpecialPurposeRange does) is in
// an exempt prefix.
func (c *Checker) Exempted(addr netip.Addr) bool {
	addr = addr.WithZone("").Unmap()
	for _, p := range c.Exempt {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// CheckAddr returns a *RangeError when addr is in a special-purpose range
// that is not exempt, else nil: the check of every address a dial to an
// endpoint the deployment reaches on its own behalf (a registry) makes.
func (c *Checker) CheckAddr(addr netip.Addr) error { return c.check("", addr, false) }

func (c *Checker) check(host string, addr netip.Addr, direct bool) error {
	if r, ok := PlatformRange(addr); ok && direct {
		return &RangeError{Host: host, Addr: addr.WithZone(""), Range: r, Platform: true}
	}
	if e, ok := c.lookup(addr); ok {
		return &RangeError{Host: host, Addr: addr.WithZone("").Unmap(), Range: e}
	}
	return nil
}

func (c *Checker) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	return lookupHost(ctx, c.Resolver, host)
}

// lookupHost resolves a hostname with r (nil: the system's resolver) into
// at least one valid address, or a *ResolveError.
func lookupHost(ctx context.Context, r Resolver, host string) ([]netip.Addr, error) {
	if r == nil {
		r = net.DefaultResolver
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, &ResolveError{Host: host, Err: err}
	}
	if len(addrs) == 0 {
		return nil, &ResolveError{Host: host, Err: errors.New("no addresses")}
	}
	for _, addr := range addrs {
		if !addr.IsValid() {
			return nil, &ResolveError{Host: host, Err: errors.New("the resolver returned an invalid address")}
		}
	}
	return addrs, nil
}
