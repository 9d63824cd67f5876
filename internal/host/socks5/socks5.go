// Package socks5 is a SOCKS5 client (RFC 1928) with username/password
// authentication (RFC 1929), over plain TCP or TLS, for CONNECT and UDP
// ASSOCIATE. Every failure that concerns the endpoint or the destination is
// an *Error whose Kind tells a fault of the endpoint apart from the failure
// of one destination.
package socks5

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/kibotos/kibotos/internal/netcheck"
)

// Endpoint is a SOCKS5 server.
type Endpoint struct {
	// Address is host:port; a hostname is resolved on every dial.
	Address string
	// Username and Password are sent with RFC 1929 when Username is not
	// empty; each is at most 255 bytes.
	Username, Password string
	// TLS wraps the connection to the endpoint; nil selects plain TCP.
	TLS *TLS
}

// TLS is how the endpoint's certificate is verified.
type TLS struct {
	// ServerName is sent as SNI and verified against the certificate; empty
	// selects the host of Endpoint.Address (an IP address is verified
	// against the certificate's IP addresses).
	ServerName string
	// CACertPEM replaces the system roots when not empty.
	CACertPEM string
}

// Resolver looks up the addresses of a hostname. *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

const (
	defaultConnectTimeout   = 10 * time.Second
	defaultHandshakeTimeout = 10 * time.Second
)

// Dialer dials through an Endpoint. Its methods may be called concurrently.
type Dialer struct {
	Endpoint Endpoint
	// Check is the dial check on the endpoint's addresses and on the UDP
	// relay address, run on every dial. An endpoint address it refuses is
	// removed; when all are removed the dial fails with EndpointUnreachable.
	// A relay address it refuses fails the dial with UDPAssociationFailed.
	// nil admits every address.
	Check func(netip.Addr) error
	// Resolver resolves the endpoint's hostname; nil selects
	// net.DefaultResolver.
	Resolver Resolver
	// ConnectTimeout bounds resolving the endpoint and connecting to it;
	// zero selects 10 seconds.
	ConnectTimeout time.Duration
	// HandshakeTimeout bounds the TLS handshake, the method negotiation,
	// the authentication and the reply to the request; zero selects 10
	// seconds.
	HandshakeTimeout time.Duration
}

// RFC 1928 and RFC 1929 constants.
const (
	socksVersion       = 0x05
	authVersion        = 0x01
	methodNone         = 0x00
	methodPassword     = 0x02
	methodNoAcceptable = 0xff
	cmdConnect         = 0x01
	cmdUDPAssociate    = 0x03
)

// DialContext connects to address (host:port) through the endpoint. An IP
// literal is sent as an IP address, anything else as a hostname the
// endpoint resolves.
//
// For network "tcp" it requests CONNECT and returns the stream to the
// destination: a *net.TCPConn or, over TLS, a *TLSStream. Either has
// CloseWrite, which ends the stream's sending direction alone, so the
// destination sees the end of what was sent and can still answer. For
// network "udp"
// it requests UDP ASSOCIATE and returns a connection whose Write sends one
// datagram to address through the relay and whose Read returns one datagram
// from it (from address itself when it is an IP literal); the control
// connection stays open for the association's life and Close closes both.
// Its Read and Write fail with an *Error of kind UDPAssociationFailed when
// the relay is reported unreachable, and with ErrAssociationEnded once the
// endpoint has closed the control connection.
//
// Failures concerning the endpoint or the destination are an *Error. An
// invalid network, address or Endpoint is a plain error, and so is a dial
// that ends because ctx is done: it wraps ctx.Err(), since the caller gave
// up before the endpoint could be judged.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var cmd byte
	switch network {
	case "tcp":
		cmd = cmdConnect
	case "udp":
		cmd = cmdUDPAssociate
	default:
		return nil, fmt.Errorf("socks5: unsupported network %q", network)
	}
	dest, err := parseAddr(address)
	if err != nil {
		return nil, fmt.Errorf("socks5: destination: %w", err)
	}
	if len(d.Endpoint.Username) > 255 || len(d.Endpoint.Password) > 255 {
		return nil, errors.New("socks5: a username or password is longer than 255 bytes")
	}
	host, port, err := netcheck.ParseHostPort(d.Endpoint.Address)
	if err != nil {
		return nil, err
	}
	raw, endpointIP, err := d.connect(ctx, host, port)
	if err != nil {
		return nil, err
	}
	raw.SetDeadline(time.Now().Add(d.handshakeTimeout()))
	// A done ctx interrupts the handshake by moving the deadline to the past.
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	c, bound, err := d.handshake(raw, host, cmd, dest)
	if !stop() {
		raw.Close()
		return nil, gaveUp(ctx)
	}
	if err != nil {
		raw.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	if cmd == cmdConnect {
		if tc, ok := c.(*tls.Conn); ok {
			return &TLSStream{tc}, nil
		}
		return c, nil
	}
	u, err := d.associate(ctx, c, endpointIP, bound, dest)
	if err != nil {
		c.Close()
		return nil, err
	}
	return u, nil
}

// TLSStream is a CONNECT stream over TLS.
type TLSStream struct {
	*tls.Conn
}

// CloseWrite sends the TLS close_notify alert and then ends the TCP
// connection's sending direction too: *tls.Conn stops at the alert, and an
// endpoint that waits for the end of the TCP stream (a TLS terminator in
// front of a SOCKS5 server, for one) would otherwise never pass the
// half-close on. Reading goes on until the endpoint closes its side.
func (s *TLSStream) CloseWrite() error {
	err := s.Conn.CloseWrite()
	if tc, ok := s.NetConn().(interface{ CloseWrite() error }); ok {
		err = errors.Join(err, tc.CloseWrite())
	}
	return err
}

func gaveUp(ctx context.Context) error {
	return fmt.Errorf("socks5: dial abandoned: %w", ctx.Err())
}

func (d *Dialer) handshakeTimeout() time.Duration {
	if d.HandshakeTimeout > 0 {
		return d.HandshakeTimeout
	}
	return defaultHandshakeTimeout
}

func (d *Dialer) connectTimeout() time.Duration {
	if d.ConnectTimeout > 0 {
		return d.ConnectTimeout
	}
	return defaultConnectTimeout
}

func (d *Dialer) unreachable(format string, args ...any) error {
	return &Error{Kind: EndpointUnreachable, Err: fmt.Errorf("endpoint %s: "+format, append([]any{d.Endpoint.Address}, args...)...)}
}

// connect resolves host, removes the addresses the check refuses and
// connects to the first of the rest that accepts (netcheck.Dial). It
// returns the address it connected to.
func (d *Dialer) connect(parent context.Context, host string, port uint16) (net.Conn, netip.Addr, error) {
	ctx, cancel := context.WithTimeout(parent, d.connectTimeout())
	defer cancel()
	c, a, err := netcheck.Dial(ctx, d.Resolver, d.Check, "tcp", host, port)
	if err == nil {
		return c, a, nil
	}
	if parent.Err() != nil {
		return nil, netip.Addr{}, gaveUp(parent)
	}
	var de *netcheck.DialError
	if errors.As(err, &de) && de.Step == netcheck.DialCheck {
		return nil, netip.Addr{}, d.unreachable("the dial check removed every address: %w", de.Err)
	}
	return nil, netip.Addr{}, d.unreachable("%w", errors.Unwrap(err))
}

// handshake runs TLS when configured, the method negotiation, the
// authentication and the request, and returns the connection to use and the
// address in the reply.
func (d *Dialer) handshake(c net.Conn, host string, cmd byte, dest addr) (net.Conn, addr, error) {
	if d.Endpoint.TLS != nil {
		tc, err := d.tlsHandshake(c, host)
		if err != nil {
			return nil, addr{}, err
		}
		c = tc
	}
	stage := "CONNECT request"
	if cmd == cmdUDPAssociate {
		stage = "UDP ASSOCIATE request"
		// The address the client will send from is not known yet, so it is
		// all zeros (RFC 1928 section 6).
		dest = addr{ip: netip.IPv4Unspecified()}
	}
	req := dest.appendTo([]byte{socksVersion, cmd, 0x00})
	if d.Endpoint.Username == "" {
		// Offered alone, "no authentication" is either selected or the
		// endpoint closes: the request goes with the greeting, which
		// saves a round trip per connection.
		if err := d.negotiate(c, req); err != nil {
			return nil, addr{}, err
		}
	} else {
		if err := d.negotiate(c, nil); err != nil {
			return nil, addr{}, err
		}
		if _, err := c.Write(req); err != nil {
			return nil, addr{}, d.ioFailed(stage, err)
		}
	}
	var hdr [3]byte // VER, REP, RSV
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, addr{}, d.ioFailed(stage, err)
	}
	if hdr[0] != socksVersion {
		return nil, addr{}, d.invalid("answered the %s with version %d", stage, hdr[0])
	}
	// A refusal is judged by REP alone: the connection is closed anyway, and
	// some endpoints close it before the rest of the reply.
	if rep := ReplyCode(hdr[1]); rep != 0 {
		if cmd == cmdUDPAssociate {
			return nil, addr{}, &Error{Kind: UDPAssociationFailed, Err: fmt.Errorf("endpoint %s refused UDP ASSOCIATE: %w", d.Endpoint.Address, rep)}
		}
		return nil, addr{}, &Error{Kind: DestinationFailed, Err: fmt.Errorf("endpoint %s refused CONNECT %s: %w", d.Endpoint.Address, dest, rep)}
	}
	bound, err := readAddr(c)
	if err != nil {
		return nil, addr{}, d.ioFailed(stage, err)
	}
	return c, bound, nil
}

func (d *Dialer) tlsHandshake(c net.Conn, host string) (*tls.Conn, error) {
	cfg := &tls.Config{ServerName: d.Endpoint.TLS.ServerName, MinVersion: tls.VersionTLS12}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	if pem := d.Endpoint.TLS.CACertPEM; pem != "" {
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM([]byte(pem)) {
			return nil, &Error{Kind: TLSVerificationFailed, Err: fmt.Errorf("endpoint %s: the CA certificate PEM holds no certificate", d.Endpoint.Address)}
		}
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		if v := new(tls.CertificateVerificationError); errors.As(err, &v) {
			return nil, &Error{Kind: TLSVerificationFailed, Err: fmt.Errorf("endpoint %s: %w", d.Endpoint.Address, err)}
		}
		return nil, d.ioFailed("TLS handshake", err)
	}
	return tc, nil
}

// negotiate selects the method and authenticates; request, when given, is
// sent in the same write as the greeting.
func (d *Dialer) negotiate(c net.Conn, request []byte) error {
	// With credentials both methods are offered: an endpoint that needs
	// none may still choose none.
	greeting := []byte{socksVersion, 1, methodNone}
	if d.Endpoint.Username != "" {
		greeting = []byte{socksVersion, 2, methodNone, methodPassword}
	}
	if _, err := c.Write(append(greeting, request...)); err != nil {
		return d.ioFailed("greeting", err)
	}
	var sel [2]byte
	if _, err := io.ReadFull(c, sel[:]); err != nil {
		return d.ioFailed("greeting", err)
	}
	switch {
	case sel[0] != socksVersion:
		return d.invalid("answered the greeting with version %d", sel[0])
	case sel[1] == methodNoAcceptable:
		return d.invalid("accepts none of the offered methods")
	case sel[1] == methodNone:
		return nil
	case sel[1] == methodPassword && d.Endpoint.Username != "":
		return d.authenticate(c)
	}
	return d.invalid("selected method 0x%02x, which was not offered", sel[1])
}

// authenticate runs RFC 1929.
func (d *Dialer) authenticate(c net.Conn) error {
	u, p := d.Endpoint.Username, d.Endpoint.Password
	req := make([]byte, 0, 3+len(u)+len(p))
	req = append(append(req, authVersion, byte(len(u))), u...)
	req = append(append(req, byte(len(p))), p...)
	if _, err := c.Write(req); err != nil {
		return d.ioFailed("authentication", err)
	}
	var resp [2]byte
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		return d.ioFailed("authentication", err)
	}
	if resp[0] != authVersion {
		return d.invalid("answered the authentication with version %d", resp[0])
	}
	if resp[1] != 0 {
		return &Error{Kind: AuthenticationFailed, Err: fmt.Errorf("endpoint %s rejected the credentials of user %q (status %d)", d.Endpoint.Address, u, resp[1])}
	}
	return nil
}

func (d *Dialer) invalid(format string, args ...any) error {
	return &Error{Kind: HandshakeFailed, Err: fmt.Errorf("endpoint %s "+format, append([]any{d.Endpoint.Address}, args...)...)}
}

// ioFailed classifies an I/O error during the handshake.
func (d *Dialer) ioFailed(stage string, err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("endpoint %s did not finish the %s within %v: %w", d.Endpoint.Address, stage, d.handshakeTimeout(), err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("endpoint %s closed the connection during the %s: %w", d.Endpoint.Address, stage, err)
	default:
		err = fmt.Errorf("endpoint %s: %s: %w", d.Endpoint.Address, stage, err)
	}
	return &Error{Kind: HandshakeFailed, Err: err}
}
