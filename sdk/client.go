// Package sdk is the Go client of Kibotos: it creates Workspaces on a
// control plane, and runs processes, moves files, reads metrics, connects
// to TCP ports, captures the screen and sends keyboard and pointer input in
// them through their data plane.
//
// A Client holds the control plane's address and an API token. Its
// lifecycle calls (CreateWorkspace, StartWorkspace, StopWorkspace,
// DeleteWorkspace) return once the Workspace has reached the state the call
// asks for, following WatchWorkspace until then; the context bounds the
// wait. It also lists and watches Workspaces, and manages Volumes and
// Templates (imported from an image archive or a registry). A Workspace is a handle on one Workspace: its Exec, Start, Upload,
// Download, DialPort, file, Metrics, Screenshot and Input methods call the Workspace's data plane with a session
// the handle issues and caches, and renews when it is about to expire or
// the data plane refuses it as expired or as not valid for the Workspace's
// execution (of an earlier start, or rotated), so that a handle outlives a
// stop and start; a session revoked stays revoked.
//
// Errors of calls are the *connect.Error the server returned, unchanged:
// callers read the code with connect.CodeOf and the Kibotos detail with
// FailureOf. A call whose connection breaks midway, as when the server
// restarts, fails with CodeUnavailable: retry it. A Workspace that ends FAILED, or in another state that will
// not lead where a call waits for, is a *StateError.
//
// The methods of Client, Workspace and Process are safe for concurrent use.
package sdk

import (
	"crypto/tls"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// Client calls one Kibotos control plane with an API token.
type Client struct {
	hc *http.Client
	// bulk carries FileBytesPath: HTTP/1.1 to http:// endpoints, where
	// hc's HTTP/2 would copy every byte in and out of frames; hc itself
	// when the caller gave one (WithHTTPClient).
	bulk       *http.Client
	opts       []connect.ClientOption // from WithClientOptions; data-plane clients share them
	sessionTTL time.Duration
	env        map[string]string // WithEnv: the default environment of every process
	// The control plane's clients are made at their first call: making
	// one reads the API's whole descriptor, a few milliseconds that a
	// command calling only a data plane with a session it was given (the
	// CLI's ws exec with its cached session) would spend for nothing.
	workspaces func() ctrlv1connect.WorkspaceServiceClient
	templates  func() ctrlv1connect.TemplateServiceClient
	volumes    func() ctrlv1connect.VolumeServiceClient
	transfers  func() ctrlv1connect.TransferServiceClient
	sessions   func() ctrlv1connect.SessionServiceClient
	exposures  func() ctrlv1connect.ExposureServiceClient
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests, control and data plane
// alike, through hc. Calls that stream their request (DialPort, and uploads
// to a data plane without FileBytesPath) need HTTP/2: against an http://
// address hc must speak HTTP/2 over cleartext (h2c) with prior knowledge, as
// the default does. The default sends FileBytesPath's requests over HTTP/1.1
// on a transport of their own; with hc, they go through hc.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// WithClientOptions adds Connect client options, such as interceptors, to
// every call of the Client, control and data plane alike. The requests of
// FileBytesPath that Upload and Download make are plain HTTP: only the
// HTTP client (WithHTTPClient) sees them.
func WithClientOptions(opts ...connect.ClientOption) Option {
	return func(c *Client) { c.opts = append(c.opts, opts...) }
}

// WithSessionTTL sets the lifetime of the data-plane sessions the Client's
// Workspaces issue; zero, the default, leaves it to the server (an hour).
func WithSessionTTL(d time.Duration) Option {
	return func(c *Client) { c.sessionTTL = d }
}

// WithEnv sets environment variables every process the Client's
// Workspaces start gets: Workspace.SetEnv and ExecOptions.Env override
// them, key by key.
func WithEnv(env map[string]string) Option {
	return func(c *Client) { c.env = maps.Clone(env) }
}

// New returns a Client of the control plane at baseURL, such as
// http://127.0.0.1:8870, that authenticates with token. Without
// WithHTTPClient it speaks HTTP/2 over cleartext (h2c) to http:// URLs and
// HTTP/2 with TLS, as negotiated, to https:// ones.
func New(baseURL, token string, opts ...Option) *Client {
	c := new(Client)
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: NewTransport(nil)}
	}
	hc := *c.hc
	c.hc = NewHTTPClient(hc.Transport)
	c.hc.CheckRedirect, c.hc.Jar, c.hc.Timeout = hc.CheckRedirect, hc.Jar, hc.Timeout
	c.bulk = c.hc
	if t, ok := hc.Transport.(*transport); ok {
		c.bulk = NewHTTPClient(t.tls)
	}
	baseURL = strings.TrimRight(baseURL, "/")
	ctrlOpts := c.clientOptions(token)
	c.workspaces = ctrlClient(c.hc, baseURL, ctrlOpts, ctrlv1connect.NewWorkspaceServiceClient)
	c.templates = ctrlClient(c.hc, baseURL, ctrlOpts, ctrlv1connect.NewTemplateServiceClient)
	c.volumes = ctrlClient(c.hc, baseURL, ctrlOpts, ctrlv1connect.NewVolumeServiceClient)
	c.transfers = ctrlClient(c.hc, baseURL, ctrlOpts, ctrlv1connect.NewTransferServiceClient)
	c.sessions = ctrlClient(c.hc, baseURL, ctrlOpts, ctrlv1connect.NewSessionServiceClient)
	c.exposures = ctrlClient(c.hc, baseURL, ctrlOpts, ctrlv1connect.NewExposureServiceClient)
	return c
}

// ctrlClient returns the control-plane client newClient makes, made at the
// first call.
func ctrlClient[C any](hc connect.HTTPClient, baseURL string, opts []connect.ClientOption,
	newClient func(connect.HTTPClient, string, ...connect.ClientOption) C) func() C {
	return sync.OnceValue(func() C { return newClient(hc, baseURL, opts...) })
}

// Close releases the Client's idle connections. Calls in flight go on; a
// later call opens new connections.
func (c *Client) Close() {
	c.hc.CloseIdleConnections()
	c.bulk.CloseIdleConnections()
}

// clientOptions are the options of a generated client that sends token.
func (c *Client) clientOptions(token string) []connect.ClientOption {
	return append([]connect.ClientOption{connect.WithInterceptors(bearer.Token(token))}, c.opts...)
}

// NewHTTPClient returns an http.Client for Kibotos calls, the one New uses:
// its requests go through base, or when base is nil through a transport
// that speaks HTTP/2 over cleartext (h2c) to http:// URLs and negotiates
// HTTP/2 with TLS to https:// ones; and a connection that breaks in the
// middle of a response, as when the server restarts, fails the call with
// CodeUnavailable instead of the protocol error Connect would read in the
// truncated stream.
func NewHTTPClient(base http.RoundTripper) *http.Client {
	if base == nil {
		base = NewTransport(nil)
	}
	return &http.Client{Transport: cutAsUnavailable{base: base}}
}

// WithTLSConfig makes the Client trust what cfg says, such as a private
// certificate authority in RootCAs, on https:// addresses (the control
// plane's and the hosts' data-plane endpoints), still speaking h2c to
// http:// ones. WithHTTPClient, when also given, wins.
func WithTLSConfig(cfg *tls.Config) Option {
	return func(c *Client) {
		if c.hc == nil {
			c.hc = &http.Client{Transport: NewTransport(cfg)}
		}
	}
}

// transport sends http:// requests as HTTP/2 with prior knowledge (h2c),
// which a Transport that also allows HTTP/1 would never try, and https://
// requests through a Transport that negotiates HTTP/2 or HTTP/1 with ALPN.
type transport struct {
	h2c *http.Transport
	// tls speaks HTTP/1.1 to http:// URLs: the Client's bulk transport.
	tls *http.Transport
}

// NewTransport returns the transport New uses by default: HTTP/2 over
// cleartext with prior knowledge (h2c) to http:// URLs, and HTTP/2 or
// HTTP/1 by ALPN to https:// ones, with cfg (nil: the system's roots).
func NewTransport(cfg *tls.Config) http.RoundTripper {
	base := &http.Transport{}
	if d, ok := http.DefaultTransport.(*http.Transport); ok {
		base = d.Clone()
	}
	if cfg != nil {
		base.TLSClientConfig = cfg.Clone()
	}
	// A downloaded file comes in 1 MiB messages; frames of that size carry
	// one in a frame instead of 64.
	base.HTTP2 = &http.HTTP2Config{MaxReadFrameSize: 1 << 20}
	h2c := base.Clone()
	h2c.Protocols = new(http.Protocols)
	h2c.Protocols.SetUnencryptedHTTP2(true)
	base.ForceAttemptHTTP2 = true
	return &transport{h2c: h2c, tls: base}
}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme == "http" {
		return t.h2c.RoundTrip(r)
	}
	return t.tls.RoundTrip(r)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach both.
func (t *transport) CloseIdleConnections() {
	t.h2c.CloseIdleConnections()
	t.tls.CloseIdleConnections()
}
