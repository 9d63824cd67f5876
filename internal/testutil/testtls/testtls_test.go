package testtls

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"
)

// handshake runs a TLS handshake over loopback TCP: the server with cfg,
// the client trusting caPEM and verifying serverName.
func handshake(t *testing.T, cfg *tls.Config, caPEM, serverName string) error {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(caPEM)) {
		t.Fatal("the CA PEM holds no certificate")
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c, err := ln.Accept(); err == nil {
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	defer func() { <-done }()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(),
		&tls.Config{RootCAs: roots, ServerName: serverName})
	if err != nil {
		return err
	}
	return c.Close()
}

func TestNew(t *testing.T) {
	cfg, caPEM := New(t, "proxy.test", "127.0.0.1", "::1")
	for _, name := range []string{"proxy.test", "127.0.0.1", "::1"} {
		if err := handshake(t, cfg, caPEM, name); err != nil {
			t.Errorf("server name %s: %v", name, err)
		}
	}
	if err := handshake(t, cfg, caPEM, "other.test"); err == nil {
		t.Error("a name the certificate does not hold was accepted")
	}
	_, otherPEM := New(t, "proxy.test")
	if err := handshake(t, cfg, otherPEM, "proxy.test"); err == nil {
		t.Error("another call's CA was trusted")
	}
}
