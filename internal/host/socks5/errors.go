package socks5

import (
	"errors"
	"fmt"
)

// Kind is the class of a failed dial or of a failed send through a UDP
// association.
type Kind int

const (
	// EndpointUnreachable: the endpoint could not be connected to: its
	// hostname did not resolve, the dial check removed every address, or no
	// address accepted the connection in time.
	EndpointUnreachable Kind = iota + 1
	// TLSVerificationFailed: the endpoint's certificate is not trusted by
	// the configured roots or does not match the server name.
	TLSVerificationFailed
	// HandshakeFailed: the negotiation failed (no acceptable method, a
	// version other than 5, a TLS handshake that failed for another reason
	// than the certificate), the endpoint answered something invalid, closed
	// the connection mid-handshake, or did not finish within the handshake
	// timeout.
	HandshakeFailed
	// AuthenticationFailed: the endpoint rejected the credentials with a
	// non-zero RFC 1929 status.
	AuthenticationFailed
	// UDPAssociationFailed: the endpoint refused UDP ASSOCIATE, the dial
	// check removed the relay address it answered, or sending to the relay
	// reported it unreachable.
	UDPAssociationFailed
	// DestinationFailed: the endpoint answered CONNECT with a non-zero reply
	// (Err wraps the ReplyCode). It is the result of one destination, not a
	// fault of the endpoint.
	DestinationFailed
)

var kindNames = map[Kind]string{
	EndpointUnreachable:   "endpoint unreachable",
	TLSVerificationFailed: "TLS verification failed",
	HandshakeFailed:       "handshake failed",
	AuthenticationFailed:  "authentication failed",
	UDPAssociationFailed:  "UDP association failed",
	DestinationFailed:     "destination failed",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is a classified failure. Its text never contains the password.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return "socks5: " + e.Kind.String() + ": " + e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// EgressFault reports whether the failure is a fault of the endpoint itself
// rather than the result of one destination. Only DestinationFailed is not,
// so a Kind added later counts as a fault.
func (e *Error) EgressFault() bool { return e.Kind != DestinationFailed }

// ReplyCode is the non-zero REP field of a reply that refused a request
// (RFC 1928 section 6).
type ReplyCode byte

var replyMeanings = map[ReplyCode]string{
	0x01: "general SOCKS server failure",
	0x02: "connection not allowed by ruleset",
	0x03: "network unreachable",
	0x04: "host unreachable",
	0x05: "connection refused",
	0x06: "TTL expired",
	0x07: "command not supported",
	0x08: "address type not supported",
}

func (c ReplyCode) Error() string {
	m, ok := replyMeanings[c]
	if !ok {
		m = "unassigned"
	}
	return fmt.Sprintf("reply 0x%02x (%s)", byte(c), m)
}

// ErrAssociationEnded is returned by Read and Write of a UDP association
// whose control connection the endpoint closed. It is not an *Error: the
// endpoint may end an idle association, and a new dial may succeed.
var ErrAssociationEnded = errors.New("socks5: the endpoint closed the control connection of the UDP association")
