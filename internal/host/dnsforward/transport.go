package dnsforward

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// errMismatch is a stream upstream's answer to some other query.
var errMismatch = errors.New("answer does not match the query")

// closeOnDone closes conn when ctx ends, so that blocked I/O returns at the
// query deadline or at once when the caller cancels. Call stop when done.
func closeOnDone(ctx context.Context, conn net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { conn.Close() })
}

// datagrams pools the receive buffers of exchangeUDP, each large enough for
// any datagram: a query's own would cost an allocation and zeroing of 64 KiB.
var datagrams = sync.Pool{New: func() any {
	b := make([]byte, dns.MaxMsgSize)
	return &b
}}

// exchangeUDP sends query as one datagram and waits for the matching
// answer. A datagram may be lost, so when no answer has come by half of the
// remaining time the query is sent once more. Answers that do not match are
// ignored: they are late, for another query, or spoofed.
func exchangeUDP(ctx context.Context, dial DialFunc, address string, q *dns.Msg, query []byte) ([]byte, error) {
	conn, err := dial(ctx, "udp", address)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	defer closeOnDone(ctx, conn)()

	deadline, _ := ctx.Deadline()
	resendAt := time.Now().Add(time.Until(deadline) / 2)
	bufp := datagrams.Get().(*[]byte)
	defer datagrams.Put(bufp)
	buf := *bufp
	for sent := 1; ; sent++ {
		if _, err := conn.Write(query); err != nil {
			return nil, err
		}
		wait := deadline
		if sent == 1 {
			wait = resendAt
		}
		if err := conn.SetReadDeadline(wait); err != nil {
			return nil, err
		}
		for {
			n, err := conn.Read(buf)
			if err != nil {
				if sent == 1 && errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
					break
				}
				return nil, err
			}
			if matches(q, buf[:n]) {
				return bytes.Clone(buf[:n]), nil
			}
		}
	}
}

// exchangeStream sends query with a 2-byte length prefix over one TCP
// connection, wrapped in TLS when cfg is set (RFC 1035 4.2.2, RFC 7858),
// and reads the answer framed the same way. The connection carries this
// query only.
func exchangeStream(ctx context.Context, dial DialFunc, address string, cfg *tls.Config, q *dns.Msg, query []byte) ([]byte, error) {
	raw, err := dial(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	defer closeOnDone(ctx, raw)()

	conn := raw
	if cfg != nil {
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		conn = tc
	}
	msg := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(query)), uint16(len(query)))
	if _, err := conn.Write(append(msg, query...)); err != nil {
		return nil, err
	}
	var n [2]byte
	if _, err := io.ReadFull(conn, n[:]); err != nil {
		return nil, err
	}
	answer := make([]byte, binary.BigEndian.Uint16(n[:]))
	if _, err := io.ReadFull(conn, answer); err != nil {
		return nil, err
	}
	if !matches(q, answer) {
		return nil, errMismatch
	}
	return answer, nil
}

// exchangeHTTPS posts query to up.URL as application/dns-message
// (RFC 8484 4.1) over a connection opened by dial and closed after the
// answer. Redirects are not followed: they count as an error status.
func exchangeHTTPS(ctx context.Context, dial DialFunc, up Upstream, q *dns.Msg, query []byte) ([]byte, error) {
	u, err := url.Parse(up.URL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("url scheme %q is not https", u.Scheme)
	}
	cfg, err := tlsConfig(up, u.Hostname())
	if err != nil {
		return nil, err
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, address string) (net.Conn, error) {
			return dial(ctx, "tcp", address)
		},
		TLSClientConfig:   cfg,
		ForceAttemptHTTP2: true,
		DisableKeepAlives: true,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{
		Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(query))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/dns-message")
	req.Header.Set("Accept", "application/dns-message")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &Error{Kind: HTTPErrorStatus, Err: fmt.Errorf("status %s", resp.Status)}
	}
	answer, err := io.ReadAll(io.LimitReader(resp.Body, dns.MaxMsgSize+1))
	if err != nil {
		return nil, err
	}
	if len(answer) > dns.MaxMsgSize {
		return nil, errors.New("answer larger than a DNS message")
	}
	if !matches(q, answer) {
		return nil, errMismatch
	}
	return answer, nil
}

// tlsConfig verifies the upstream's certificate against up.CACertPEM, or the
// system roots, for up.ServerName, or host when that is empty.
func tlsConfig(up Upstream, host string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: up.ServerName, MinVersion: tls.VersionTLS12}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	if up.CACertPEM != "" {
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM([]byte(up.CACertPEM)) {
			return nil, &Error{Kind: TLSVerificationFailed, Err: errors.New("ca_cert holds no PEM certificate")}
		}
		cfg.RootCAs = roots
	}
	return cfg, nil
}
