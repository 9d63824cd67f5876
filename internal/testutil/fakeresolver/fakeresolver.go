// Package fakeresolver answers hostname lookups from a table, so that tests
// of code that resolves names never send a DNS query.
package fakeresolver

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Resolver answers LookupNetIP from its table and records every lookup. A
// host not in the table is not found, as net.Resolver reports it. It is
// safe for concurrent use.
type Resolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	err     error
	lookups []Lookup
}

// Lookup is one call of LookupNetIP.
type Lookup struct {
	Network, Host string
	// Timeout is the time that was left until the context's deadline, or
	// 0 for a context without one.
	Timeout time.Duration
}

// New returns a resolver that answers from answers (host to addresses).
func New(answers map[string][]netip.Addr) *Resolver {
	table := make(map[string][]netip.Addr, len(answers))
	for host, addrs := range answers {
		table[host] = addrs
	}
	return &Resolver{answers: table}
}

// Failing returns a resolver whose every lookup fails with err.
func Failing(err error) *Resolver {
	return &Resolver{err: err}
}

// Set changes the answer for host from the next lookup on.
func (r *Resolver) Set(host string, addrs ...netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers[host] = addrs
}

// LookupNetIP records the lookup, then answers from the table; a context
// already done fails the lookup with its error.
func (r *Resolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := Lookup{Network: network, Host: host}
	if d, ok := ctx.Deadline(); ok {
		l.Timeout = time.Until(d)
	}
	r.lookups = append(r.lookups, l)
	if r.err != nil {
		return nil, r.err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	addrs, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// Lookups returns every lookup so far, oldest first.
func (r *Resolver) Lookups() []Lookup {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Lookup(nil), r.lookups...)
}
