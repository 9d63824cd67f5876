package netcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// MinAttempt is the least time Dial gives one address of several, as
// net.Dialer does, so that an address that swallows packets does not
// starve the ones after it of all but a sliver.
const MinAttempt = 2 * time.Second

// DialStep is the step of Dial that failed.
type DialStep int

// The steps of Dial.
const (
	// DialResolve: the hostname did not resolve to any address.
	DialResolve DialStep = iota + 1
	// DialCheck: the check refused every address.
	DialCheck
	// DialConnect: no admitted address accepted the connection.
	DialConnect
)

// DialError is a failed Dial: the step, and why.
type DialError struct {
	Step DialStep
	Err  error
}

func (e *DialError) Error() string { return e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// Dial connects to host:port over network ("tcp" or "udp") with a check on
// every address: host is resolved with r (nil: the system's resolver; an
// IP address is taken as it is; a failure is a *ResolveError), the addresses check refuses are dropped
// (nil admits all), and the rest are tried in order, each attempt getting
// an equal share of the time ctx has left but at least MinAttempt. It
// returns the connection and the address it reached; an error is a
// *DialError. Addresses are compared and dialed without IPv4 mapping, the
// form resolvers may return them in.
func Dial(ctx context.Context, r Resolver, check func(netip.Addr) error, network, host string, port uint16) (net.Conn, netip.Addr, error) {
	addrs, err := Resolve(ctx, r, host)
	if err != nil {
		return nil, netip.Addr{}, &DialError{Step: DialResolve, Err: err}
	}
	admitted, err := Admit(addrs, check)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	var dialer net.Dialer
	var errs []error
	for i, a := range admitted {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok {
			share := max(time.Until(dl)/time.Duration(len(admitted)-i), MinAttempt)
			actx, cancel = context.WithTimeout(ctx, share)
		}
		c, err := dialer.DialContext(actx, network, netip.AddrPortFrom(a, port).String())
		cancel()
		if err == nil {
			return c, a, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, netip.Addr{}, &DialError{Step: DialConnect, Err: errors.Join(errs...)}
}

// DialAddress is Dial to an address written host:port, as ParseHostPort
// reads it; it returns only the connection.
func DialAddress(ctx context.Context, r Resolver, check func(netip.Addr) error, network, address string) (net.Conn, error) {
	host, port, err := ParseHostPort(address)
	if err != nil {
		return nil, err
	}
	c, _, err := Dial(ctx, r, check, network, host, port)
	return c, err
}

// Resolve returns the addresses of host: itself when it is an IP address,
// else what r (nil: the system's resolver) finds, or a *ResolveError.
func Resolve(ctx context.Context, r Resolver, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	return lookupHost(ctx, r, host)
}

// Admit returns the addresses check admits (nil admits all), without IPv4
// mapping, in order; when it refuses every one, the error is a
// *DialError at DialCheck that says why for each.
func Admit(addrs []netip.Addr, check func(netip.Addr) error) ([]netip.Addr, error) {
	var admitted []netip.Addr
	var refused []error
	for _, a := range addrs {
		a = a.Unmap()
		if check != nil {
			if err := check(a); err != nil {
				refused = append(refused, fmt.Errorf("%s: %w", a, err))
				continue
			}
		}
		admitted = append(admitted, a)
	}
	if len(admitted) == 0 {
		return nil, &DialError{Step: DialCheck, Err: errors.Join(refused...)}
	}
	return admitted, nil
}
