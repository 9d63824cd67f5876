package daemon

// This file is the listener a process serves on: TCP, or TLS with the
// operator's certificate, and the URL callers reach it at.

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/kibotos/kibotos/internal/cafile"
)

// checkListen checks the --listen address before anything is set up: a
// host (or none) and a port that can be.
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	return nil
}

// listen opens the TCP listener of o.Listen, serving TLS with
// o.TLSCert and o.TLSKey when both are set (HTTP/2 negotiated by ALPN,
// HTTP/1.1 otherwise). It returns the certificate served, nil without TLS.
func listen(o Options) (net.Listener, *tls.Certificate, error) {
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return nil, nil, errors.New("--tls-cert and --tls-key go together")
	}
	var cert *tls.Certificate
	if o.TLSCert != "" {
		c, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return nil, nil, fmt.Errorf("TLS certificate: %w", err)
		}
		cert = &c
	}
	ln, err := listenOn(o.Listen, cert)
	return ln, cert, err
}

// listenOn listens on addr, serving TLS with cert unless it is nil. It
// holds at most connectionLimit connections at once.
func listenOn(addr string, cert *tls.Certificate) (net.Listener, error) {
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	limited := limitConnections(tcp, connectionLimit())
	if cert == nil {
		return limited, nil
	}
	return tlsListener{tls.NewListener(limited, &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: []string{"h2", "http/1.1"},
		MinVersion: tls.VersionTLS12}), limited}, nil
}

// tlsListener is a TLS listener over a limitedListener, whose ConnState
// (server.Serve's hook) it passes on.
type tlsListener struct {
	net.Listener
	limited *limitedListener
}

// ConnState tells the limitedListener under l of a connection's state.
func (l tlsListener) ConnState(c net.Conn, state http.ConnState) { l.limited.ConnState(c, state) }

// scheme is the URL scheme of a listener serving cert (nil: none).
func scheme(cert *tls.Certificate) string {
	if cert != nil {
		return "https"
	}
	return "http"
}

// selfClient is the HTTP client of the host agent `kibotos up` embeds,
// which reaches the control plane on the same listener: with TLS it
// trusts exactly the certificate the listener serves, whatever names it
// carries.
func selfClient(cert *tls.Certificate) *http.Client {
	if cert == nil {
		return http.DefaultClient
	}
	leaf := cert.Certificate[0]
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The pin below replaces the name and chain checks.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, leaf) {
				return errors.New("the listener presented another certificate")
			}
			return nil
		},
	}
	t.ForceAttemptHTTP2 = true
	return &http.Client{Transport: t}
}

// ClientFor returns the HTTP client of a lone host agent: it trusts the
// certificate authorities in caFile (PEM) beside the system's; an empty
// caFile is http.DefaultClient.
func ClientFor(caFile string) (*http.Client, error) {
	if caFile == "" {
		return http.DefaultClient, nil
	}
	cfg, err := cafile.Load(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = cfg
	t.ForceAttemptHTTP2 = true
	return &http.Client{Transport: t}, nil
}
