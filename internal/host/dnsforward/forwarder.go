// Package dnsforward answers the DNS queries a guest sends to its link DNS
// address by forwarding each one to a single upstream over UDP, TCP, TLS
// (RFC 7858) or HTTPS (RFC 8484), and classifies why an upstream fails.
//
// A query is never sent anywhere but the configured upstream: when the
// upstream is unavailable the guest gets SERVFAIL. A Cache in front of a
// Forwarder answers repeated questions for as long as their TTLs allow.
package dnsforward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/miekg/dns"
)

// Protocol is how queries reach an upstream.
type Protocol int

const (
	// UDP sends each query as one datagram to Upstream.Address.
	UDP Protocol = iota
	// TCP sends each query length-prefixed over a TCP connection to
	// Upstream.Address (RFC 1035 4.2.2).
	TCP
	// TLS sends each query length-prefixed over a TLS connection to
	// Upstream.Address (RFC 7858).
	TLS
	// HTTPS posts each query as application/dns-message to Upstream.URL
	// (RFC 8484).
	HTTPS
)

// String returns the protocol's lowercase name, as the API spells it.
func (p Protocol) String() string {
	switch p {
	case UDP:
		return "udp"
	case TCP:
		return "tcp"
	case TLS:
		return "tls"
	case HTTPS:
		return "https"
	}
	return fmt.Sprintf("Protocol(%d)", int(p))
}

// Upstream is the resolver queries are forwarded to.
type Upstream struct {
	Protocol Protocol
	// Address is host:port for UDP, TCP and TLS.
	Address string
	// URL is the DoH endpoint for HTTPS; it must use the https scheme.
	URL string
	// ServerName is the name the TLS or HTTPS upstream's certificate must
	// match; empty means the host of Address or URL.
	ServerName string
	// CACertPEM holds the roots a TLS or HTTPS upstream's certificate must
	// chain to; empty means the system roots.
	CACertPEM string
}

// DialFunc opens the upstream leg of a query: network is "udp" or "tcp" and
// address is host:port. An error that implements interface{ EgressFault() bool }
// and returns true is a fault of the Egress the leg goes through, not of the
// upstream.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// defaultTimeout bounds a query when Forwarder.Timeout is zero; stub
// resolvers commonly give up after 5 seconds.
const defaultTimeout = 5 * time.Second

// Forwarder forwards queries to one Upstream. Each query uses its own
// connection, which is closed once the query is answered: no state outlives
// a call, so a Forwarder needs no Close and is safe for concurrent use.
type Forwarder struct {
	Upstream Upstream
	// Dial opens every connection to the upstream, including the TCP
	// connections of HTTPS. It must be set: without it every query fails
	// with UpstreamUnreachable.
	Dial DialFunc
	// Timeout is the deadline of one query, from the call to Answer to the
	// upstream's answer; zero means 5 seconds.
	Timeout time.Duration
	// Report, when set, is called after each exchange with the upstream:
	// with nil when the upstream answered, with a *Error when it did not, or
	// with the Dial error itself when that error is an Egress fault. It is
	// not called for queries that are dropped or answered without an
	// exchange, nor when ctx is canceled before the upstream answers. It
	// may be called concurrently.
	Report func(err error)
}

// Answer forwards query, a DNS message in wire format, and returns the
// reply to send to the guest. A query that cannot be forwarded is answered
// as Fail answers it: FORMERR when it is malformed, or nil, meaning drop it,
// when it is too short to carry an ID or is itself a response. When the
// upstream fails the reply is SERVFAIL for the query's ID and question;
// whatever the upstream answers, NXDOMAIN and SERVFAIL included, is passed
// through unchanged. Answer respects the query's EDNS0 size only as far as
// the upstream does; see FitUDP for replies sent over UDP.
func (f *Forwarder) Answer(ctx context.Context, query []byte) []byte {
	q, reply := parse(query)
	if q == nil {
		return reply
	}
	return f.answer(ctx, q, query)
}

// answer forwards query, whose parsed form is q, as Answer does.
func (f *Forwarder) answer(ctx context.Context, q *dns.Msg, query []byte) []byte {
	timeout := f.Timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	answer, err := f.exchange(qctx, q, query)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		// The caller gave up; the upstream may be fine.
		return respond(q, dns.RcodeServerFailure)
	}
	if err != nil {
		err = classify(qctx, err)
	}
	if f.Report != nil {
		f.Report(err)
	}
	if err != nil {
		return respond(q, dns.RcodeServerFailure)
	}
	return answer
}

// exchange sends query, whose parsed form is q, to the upstream and returns
// its matching answer.
func (f *Forwarder) exchange(ctx context.Context, q *dns.Msg, query []byte) ([]byte, error) {
	if f.Dial == nil {
		return nil, errors.New("no dial function")
	}
	up := f.Upstream
	switch up.Protocol {
	case UDP:
		answer, err := exchangeUDP(ctx, f.Dial, up.Address, q, query)
		if err != nil || !truncated(answer) {
			return answer, err
		}
		// The answer does not fit a datagram: ask over TCP, as a stub
		// resolver does (RFC 7766), so that a guest asking over TCP gets
		// it whole. An upstream that serves no TCP leaves the truncated
		// answer, which says as much.
		if whole, err := exchangeStream(ctx, f.Dial, up.Address, nil, q, query); err == nil {
			return whole, nil
		}
		return answer, nil
	case TCP:
		return exchangeStream(ctx, f.Dial, up.Address, nil, q, query)
	case TLS:
		host, _, err := net.SplitHostPort(up.Address)
		if err != nil {
			return nil, err
		}
		cfg, err := tlsConfig(up, host)
		if err != nil {
			return nil, err
		}
		return exchangeStream(ctx, f.Dial, up.Address, cfg, q, query)
	case HTTPS:
		return exchangeHTTPS(ctx, f.Dial, up, q, query)
	}
	return nil, fmt.Errorf("unknown protocol %v", up.Protocol)
}

// truncated reports whether the DNS message b has the TC bit.
func truncated(b []byte) bool { return len(b) > 2 && b[2]&0x02 != 0 }

// Kind is why queries to an upstream fail. The values are numbered as the
// API's ResolverObservationKind.
type Kind int

const (
	// UpstreamUnreachable: the upstream could not be connected to, or the
	// exchange failed before it answered.
	UpstreamUnreachable Kind = iota + 1
	// UpstreamTimeout: the upstream did not answer within the query deadline.
	UpstreamTimeout
	// TLSVerificationFailed: the certificate of a TLS or HTTPS upstream is
	// not trusted or does not match its server name.
	TLSVerificationFailed
	// HTTPErrorStatus: an HTTPS upstream answered with a status outside 2xx.
	HTTPErrorStatus
)

// String returns a short lowercase description of the kind.
func (k Kind) String() string {
	switch k {
	case UpstreamUnreachable:
		return "upstream unreachable"
	case UpstreamTimeout:
		return "upstream timeout"
	case TLSVerificationFailed:
		return "tls verification failed"
	case HTTPErrorStatus:
		return "http error status"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is a failed exchange with the upstream.
type Error struct {
	Kind Kind
	Err  error
}

// Error returns the kind followed by the underlying error.
func (e *Error) Error() string { return e.Kind.String() + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// egressFault is what a DialFunc error implements to blame the Egress.
type egressFault interface {
	error
	EgressFault() bool
}

// classify turns the error of an exchange bounded by ctx into what Report
// receives: the Dial error itself for an Egress fault, else a *Error.
func classify(ctx context.Context, err error) error {
	if ef, ok := errors.AsType[egressFault](err); ok && ef.EgressFault() {
		return ef
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e
	}
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return &Error{Kind: TLSVerificationFailed, Err: err}
	}
	// Connections are closed when ctx ends, so the I/O error of a timed-out
	// query may be "use of closed network connection": ctx tells.
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return &Error{Kind: UpstreamTimeout, Err: err}
	}
	return &Error{Kind: UpstreamUnreachable, Err: err}
}
