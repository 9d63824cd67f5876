// Package registry pulls template images from OCI registries for the
// control plane: go-containerregistry's remote client over a transport
// that dials only addresses the deployment's check admits, speaks plain
// HTTP only to registries the operator listed as insecure, and trusts the
// certificate authorities the operator gave for registries with private
// certificates.
//
// The image it returns is lazy: its blobs are fetched while the image
// store reads them, and the image store verifies every blob in full, as it
// does for an uploaded archive.
package registry

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/kibotos/kibotos/internal/netcheck"
)

// Errors of Pull, matched with errors.Is; any other error means the
// registry could not be reached or failed.
var (
	// ErrNotFound: the registry has no such repository, tag or digest, or
	// the index has no image of the platform.
	ErrNotFound = errors.New("not found in the registry")
	// ErrDenied: the registry refused the credentials, or wants some and
	// none were given.
	ErrDenied = errors.New("the registry refused access")
	// ErrRefused: this deployment may not reach the registry (its address
	// is in a special-purpose range, or it would take plain HTTP to a
	// registry not listed as insecure).
	ErrRefused = errors.New("the deployment does not reach this registry")
	// ErrBadBlob: a blob the registry served is not the one the image's
	// manifest names (its size or digest differs); see BlobError.
	ErrBadBlob = errors.New("a blob the registry served does not match the image's manifest")
	// ErrBadReference: the reference or the platform cannot be pulled as
	// written.
	ErrBadReference = errors.New("invalid image reference")
)

// Credentials authenticate a pull; the zero value pulls anonymously.
type Credentials struct {
	Username, Password string
	// IdentityToken is an OAuth2 refresh token, as docker login stores it
	// for some registries.
	IdentityToken string
}

func (c Credentials) authenticator() authn.Authenticator {
	if c == (Credentials{}) {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password, IdentityToken: c.IdentityToken})
}

// Puller pulls images. The zero value dials every address and reaches
// every registry over HTTPS.
type Puller struct {
	// Check refuses an address a pull would dial (nil admits all). Every
	// connection is checked when it is dialed, redirects included.
	Check func(netip.Addr) error
	// Resolver resolves registry host names; nil is the system's.
	Resolver netcheck.Resolver
	// Insecure lists the registries (host:port, as references name them)
	// reached over plain HTTP; every other one is reached over HTTPS.
	Insecure []string
	// RootCAs are the certificate authorities HTTPS registries are
	// verified against; nil is the system's.
	RootCAs *x509.CertPool
	// UserAgent names this client to registries.
	UserAgent string
	// Idle bounds how long a registry may leave a read of its answer
	// waiting (0: DefaultIdle): one that accepts and then says nothing
	// fails the pull rather than holding it, and its caller, for good.
	Idle time.Duration

	once sync.Once
	rt   http.RoundTripper
	// tlsFailed holds, by host, why its last HTTPS request failed: the
	// certificate check, or Check refusing the address. go-containerregistry
	// then tries plain HTTP to a registry on a loopback or private address,
	// and the error of that attempt alone would hide the cause.
	tlsFailed sync.Map
}

// DefaultIdle is how long a registry may leave a read waiting, unless
// Puller.Idle says otherwise.
const DefaultIdle = time.Minute

// DefaultPlatform is the platform an image index is resolved to when the
// pull names none: the one the deployment's hosts run.
var DefaultPlatform = v1.Platform{OS: "linux", Architecture: "amd64"}

// ParsePlatform parses os/arch[/variant]; empty is DefaultPlatform.
func ParsePlatform(s string) (v1.Platform, error) {
	if s == "" {
		return DefaultPlatform, nil
	}
	p, err := v1.ParsePlatform(s)
	if err != nil || p.OS == "" || p.Architecture == "" || strings.Count(s, "/") > 2 || strings.Contains(s, ":") {
		return v1.Platform{}, fmt.Errorf("%w: platform %q: want os/arch[/variant], such as linux/amd64", ErrBadReference, s)
	}
	return *p, nil
}

// Pull resolves ref (a tag or a digest reference) to one image: the image
// itself, or, for an image index, its image of platform. Errors wrap
// ErrNotFound, ErrDenied, ErrRefused or ErrBadReference, or say why the
// registry could not be reached.
func (p *Puller) Pull(ctx context.Context, ref string, platform v1.Platform, creds Credentials) (v1.Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadReference, err)
	}
	reg := r.Context().RegistryStr()
	if slices.Contains(p.Insecure, reg) {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadReference, err)
		}
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(creds.authenticator()),
		remote.WithTransport(p.roundTripper()),
		remote.WithPlatform(platform),
		remote.WithUserAgent(p.UserAgent),
		remote.WithRetryBackoff(remote.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: 2}),
	}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, classify(reg, r.String(), err)
	}
	if !desc.MediaType.IsIndex() {
		img, err := desc.Image()
		if err != nil {
			return nil, classify(reg, r.String(), err)
		}
		return img, nil
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, classify(reg, r.String(), err)
	}
	return pick(ctx, reg, r.String(), idx, platform)
}

// pick returns the image of platform in idx, descending into nested
// indexes.
func pick(ctx context.Context, reg, ref string, idx v1.ImageIndex, platform v1.Platform) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, classify(reg, ref, err)
	}
	var have []string
	// An image of the variant asked for comes first: linux/amd64/v3 also
	// satisfies linux/amd64, but needs a CPU that linux/amd64 does not.
	var other *v1.Descriptor
	image := func(d v1.Descriptor) (v1.Image, error) {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, classify(reg, ref, err)
		}
		return img, nil
	}
	for _, d := range m.Manifests {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, classify(reg, ref, err)
			}
			if img, err := pick(ctx, reg, ref, child, platform); !errors.Is(err, ErrNotFound) {
				return img, err
			}
		case d.Platform == nil:
		case d.Platform.Satisfies(platform) && d.Platform.Variant == platform.Variant:
			return image(d)
		case d.Platform.Satisfies(platform):
			if other == nil {
				other = &d
			}
		default:
			have = append(have, d.Platform.String())
		}
	}
	if other != nil {
		return image(*other)
	}
	return nil, fmt.Errorf("%s: %w: the image index has no %s image (it has %s)", ref, ErrNotFound, platform.String(), orNone(have))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none with a platform"
	}
	return strings.Join(s, ", ")
}

// BlobError classifies an error of reading the blobs of an image that
// Pull returned for ref, as Pull's own errors are: a blob the registry
// lacks is ErrNotFound, one it refuses ErrDenied, one that is not what the
// manifest says ErrBadBlob.
func BlobError(ref string, err error) error {
	if blobMismatch(err) {
		return fmt.Errorf("%s: %w: %v", ref, ErrBadBlob, err)
	}
	reg := ""
	if r, perr := name.ParseReference(ref); perr == nil {
		reg = r.Context().RegistryStr()
	}
	return classify(reg, ref, err)
}

// blobMismatch reports whether err is go-containerregistry's check of a
// blob against its descriptor failing. The library's errors for it have
// no exported type, only these words.
func blobMismatch(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "does not match expected size") || strings.Contains(msg, "error verifying")
}

// Classified reports whether err is of one of the kinds of Pull's errors.
func Classified(err error) bool {
	for _, kind := range []error{ErrNotFound, ErrDenied, ErrRefused, ErrBadReference, ErrBadBlob} {
		if errors.Is(err, kind) {
			return true
		}
	}
	return false
}

// classify wraps a pull's error in the error of its kind.
func classify(reg, ref string, err error) error {
	var (
		terr    *transport.Error
		insec   *insecureError
		dialErr *netcheck.DialError
	)
	switch {
	case errors.As(err, &insec):
		return fmt.Errorf("%s: %w: %v", ref, ErrRefused, insec)
	case errors.As(err, &dialErr) && dialErr.Step == netcheck.DialCheck:
		return fmt.Errorf("%s: %w: registry %s: %v", ref, ErrRefused, reg, dialErr)
	case errors.As(err, &terr):
		switch {
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden ||
			hasCode(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return fmt.Errorf("%s: %w (HTTP %d): the credentials are wrong, or the image needs some (--username and --password-stdin, or docker login), or the repository does not exist",
				ref, ErrDenied, terr.StatusCode)
		case terr.StatusCode == http.StatusNotFound ||
			hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return fmt.Errorf("%s: %w: %v", ref, ErrNotFound, terr)
		}
	}
	return fmt.Errorf("%s: %w", ref, err)
}

func hasCode(e *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range e.Errors {
		if slices.Contains(codes, d.Code) {
			return true
		}
	}
	return false
}

// insecureError is a plain-HTTP request to a registry not listed as
// insecure; tlsErr is why HTTPS failed before it, if it did.
type insecureError struct {
	host   string
	tlsErr error
}

func (e *insecureError) Error() string {
	if e.tlsErr != nil {
		return fmt.Sprintf("registry %s: HTTPS failed (%v): start the server with --registry-ca-file if a private authority signed its certificate", e.host, e.tlsErr)
	}
	return fmt.Sprintf("registry %s would be reached over plain HTTP; the server reaches registries over HTTPS unless started with --insecure-registry %s", e.host, e.host)
}

// roundTripper is the HTTP transport of every pull, built at the first.
func (p *Puller) roundTripper() http.RoundTripper {
	p.once.Do(func() { p.rt = p.transport() })
	return p.rt
}

// transport builds the HTTP transport of pulls.
func (p *Puller) transport() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil // a proxy would dial on our behalf, unchecked
	if p.RootCAs != nil {
		t.TLSClientConfig = &tls.Config{RootCAs: p.RootCAs, MinVersion: tls.VersionTLS12}
	}
	idle := cmp.Or(p.Idle, DefaultIdle)
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		conn, err := netcheck.DialAddress(ctx, p.Resolver, p.Check, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return idleConn{conn, idle}, nil
	}
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.URL.Scheme == "http" && !p.insecure(req.URL.Host) {
			e := &insecureError{host: req.URL.Host}
			if v, ok := p.tlsFailed.Load(req.URL.Host); ok {
				if refused, ok := v.(*netcheck.DialError); ok {
					return nil, refused // whatever the scheme
				}
				e.tlsErr = v.(error)
			}
			return nil, e
		}
		resp, err := t.RoundTrip(req)
		var (
			certErr *tls.CertificateVerificationError
			dialErr *netcheck.DialError
		)
		switch {
		case req.URL.Scheme != "https":
		case errors.As(err, &certErr):
			p.tlsFailed.Store(req.URL.Host, certErr)
		case errors.As(err, &dialErr) && dialErr.Step == netcheck.DialCheck:
			p.tlsFailed.Store(req.URL.Host, dialErr)
		case err == nil:
			p.tlsFailed.Delete(req.URL.Host)
		}
		return resp, err
	})
}

// insecure reports whether host (host[:port] of a URL) is listed.
func (p *Puller) insecure(host string) bool {
	if slices.Contains(p.Insecure, host) {
		return true
	}
	// A listed registry without a port is port 80 over HTTP.
	h, port, err := net.SplitHostPort(host)
	return err == nil && port == "80" && slices.Contains(p.Insecure, h)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// idleConn is a connection whose every read waits at most idle.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c idleConn) Read(b []byte) (int, error) {
	c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	return c.Conn.Read(b)
}
