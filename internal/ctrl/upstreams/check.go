// Package upstreams is ctrl's EgressService and ResolverService: the
// objects a workspace's network policy sends traffic through (an Egress, a
// SOCKS5 endpoint) and resolves names with (a Resolver, a DNS upstream).
// Both kinds share one Service: create, get, list, update (CAS on
// revision, with a drain for connections on the replaced revision), delete
// (refused while a workspace policy references the object), and label and
// annotation replacement (CAS on their own revisions). A Kind supplies what
// differs: the spec type, its rules (this file: the limits the API
// reference sets), and what reads must not return.
//
// Every error this package returns is a *connect.Error with its canonical
// code, or an internal error that the server reports as such.
package upstreams

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// Limits from the API reference.
const (
	// MaxCACertBytes bounds ca_cert.
	MaxCACertBytes = 64 << 10
	// MaxCredentialBytes bounds a SOCKS5 username or password (RFC 1929).
	MaxCredentialBytes = 255
)

// CheckEgressSpec checks an EgressSpec's syntax and limits. It does not
// resolve or range-check the endpoint; CheckEgressEndpoint does.
func CheckEgressSpec(spec *ctrlv1.EgressSpec) error {
	if spec == nil {
		return errors.New("spec is required")
	}
	s := spec.GetSocks5()
	if s == nil {
		return errors.New("spec must select exactly one protocol: spec.socks5 is required")
	}
	if _, _, err := netcheck.ParseHostPort(s.GetAddress()); err != nil {
		return fmt.Errorf("spec.socks5.address: %w", err)
	}
	if err := credential("spec.socks5.username", s.GetUsername()); err != nil {
		return err
	}
	if err := credential("spec.socks5.password", s.GetPassword()); err != nil {
		return err
	}
	if (s.GetUsername() == "") != (s.GetPassword() == "") {
		return errors.New("spec.socks5: username and password are given together or not at all (RFC 1929)")
	}
	if t := s.GetTls(); t != nil {
		return checkTLS("spec.socks5.tls", t.GetServerName(), t.GetCaCert())
	}
	return nil
}

func credential(field, v string) error {
	if len(v) > MaxCredentialBytes {
		return fmt.Errorf("%s is %d bytes; it must be 1 to %d bytes", field, len(v), MaxCredentialBytes)
	}
	return nil
}

// CheckEgressEndpoint refuses an endpoint in a fixed special-purpose range,
// resolving a hostname once. It only reports a mistake early: the endpoint
// is checked again on every dial.
func CheckEgressEndpoint(ctx context.Context, c *netcheck.Checker, spec *ctrlv1.EgressSpec) error {
	if err := c.CheckEndpoint(ctx, spec.GetSocks5().GetAddress()); err != nil {
		return fmt.Errorf("spec.socks5.address: %w", err)
	}
	return nil
}

// RedactEgressSpec returns a copy of spec without its write-only password.
func RedactEgressSpec(spec *ctrlv1.EgressSpec) *ctrlv1.EgressSpec {
	out := proto.CloneOf(spec)
	if s := out.GetSocks5(); s != nil {
		s.Password = ""
	}
	return out
}

// CheckResolverSpec checks a ResolverSpec's syntax and limits. A Resolver's
// upstream is not range-checked here: through an Egress it may sit in the
// caller's private network, and the policy that selects it checks it.
func CheckResolverSpec(spec *ctrlv1.ResolverSpec) error {
	if spec == nil {
		return errors.New("spec is required")
	}
	switch p := spec.GetProtocol().(type) {
	case *ctrlv1.ResolverSpec_Udp:
		return address("spec.udp.address", p.Udp.GetAddress())
	case *ctrlv1.ResolverSpec_Tcp:
		return address("spec.tcp.address", p.Tcp.GetAddress())
	case *ctrlv1.ResolverSpec_Tls:
		if err := address("spec.tls.address", p.Tls.GetAddress()); err != nil {
			return err
		}
		return checkTLS("spec.tls", p.Tls.GetServerName(), p.Tls.GetCaCert())
	case *ctrlv1.ResolverSpec_Https:
		if err := checkURL("spec.https.url", p.Https.GetUrl()); err != nil {
			return err
		}
		return checkTLS("spec.https", p.Https.GetServerName(), p.Https.GetCaCert())
	}
	return errors.New("spec must select exactly one protocol: udp, tcp, tls or https")
}

func address(field, v string) error {
	if _, _, err := netcheck.ParseHostPort(v); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	return nil
}

// checkURL accepts an absolute https URL with a valid host and no
// credentials or fragment (anything a read returns must hold no secret).
func checkURL(field, v string) error {
	u, err := url.Parse(v)
	switch {
	case v == "":
		return fmt.Errorf("%s is required", field)
	case err != nil:
		return fmt.Errorf("%s: %v", field, err)
	case u.Scheme != "https":
		return fmt.Errorf("%s %q: must be an https:// URL", field, v)
	case u.User != nil:
		return fmt.Errorf("%s %q: must not carry credentials", field, v)
	case u.Fragment != "" || strings.Contains(v, "#"):
		return fmt.Errorf("%s %q: must not have a fragment", field, v)
	case u.Opaque != "":
		return fmt.Errorf("%s %q: is not a hierarchical URL", field, v)
	}
	hostport := u.Host
	if u.Port() == "" {
		hostport = strings.TrimSuffix(strings.TrimPrefix(u.Hostname(), "["), "]")
		if strings.Contains(hostport, ":") {
			hostport = "[" + hostport + "]"
		}
		hostport += ":443"
	}
	if _, _, err := netcheck.ParseHostPort(hostport); err != nil {
		return fmt.Errorf("%s %q: host: %w", field, v, err)
	}
	return nil
}

// checkTLS checks server_name (empty selects the address's host) and
// ca_cert (PEM certificates, at most MaxCACertBytes).
func checkTLS(field, serverName, caCert string) error {
	if serverName != "" {
		if err := netcheck.ValidateHost(serverName); err != nil {
			return fmt.Errorf("%s.server_name: %w", field, err)
		}
	}
	if caCert == "" {
		return nil
	}
	if len(caCert) > MaxCACertBytes {
		return fmt.Errorf("%s.ca_cert is %d bytes, more than %d (64 KiB)", field, len(caCert), MaxCACertBytes)
	}
	rest := []byte(caCert)
	n := 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("%s.ca_cert: PEM block %d is %q, want CERTIFICATE", field, n+1, block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return fmt.Errorf("%s.ca_cert: certificate %d: %v", field, n+1, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s.ca_cert holds no PEM certificate", field)
	}
	if strings.TrimSpace(string(rest)) != "" {
		return fmt.Errorf("%s.ca_cert has text after its last certificate that is not PEM", field)
	}
	return nil
}
