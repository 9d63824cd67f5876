// Package daemon runs the control plane as a process: it opens the store,
// bootstraps the deployment's first admin token, and serves until its
// context ends. `kibotos up` runs it embedded (SQLite under a home
// directory); `kibotos ctrl` runs it on a store URL (PostgreSQL).
package daemon

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"gocloud.dev/blob"
	"golang.org/x/sync/errgroup"

	"github.com/kibotos/kibotos/internal/admission"
	"github.com/kibotos/kibotos/internal/buildinfo"
	"github.com/kibotos/kibotos/internal/cafile"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/changes/pgnotify"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/health"
	"github.com/kibotos/kibotos/internal/ctrl/registry"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/postgres"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlite"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/host/agent"
	"github.com/kibotos/kibotos/internal/host/psi"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/logging"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/tracing"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// Defaults of `kibotos up`.
const (
	DefaultHome   = "/var/lib/kibotos"
	DefaultListen = "127.0.0.1:8870"
)

// AdminTokenFile is the file under the home directory that holds the
// bootstrap admin token, one line, mode 0600.
const AdminTokenFile = "admin-token"

// transferSweepEvery is how often the transfers' loop looks at every
// pending Transfer when no change wakes it.
const transferSweepEvery = 5 * time.Second

// shutdownGrace is how long calls in flight may finish after SIGTERM.
const shutdownGrace = 10 * time.Second

// Options configure one control-plane process.
type Options struct {
	// Home is the state directory. With an empty StoreURL the SQLite
	// database lives in it; when set, the bootstrap admin token is written
	// to Home/admin-token.
	Home string
	// StoreURL selects the store: postgres://... or postgresql://...; empty
	// selects SQLite under Home.
	StoreURL string
	// Listen is the TCP address to serve on.
	Listen string
	// PublicURL is the URL callers reach the listener at; empty derives
	// it from the listening address (see PublicURL).
	PublicURL string
	// ExposureDomain, with a host agent here, serves exposures by host
	// name under this DNS name (a wildcard name and certificate are the
	// operator's), and only so; empty serves them by path: under
	// ExposurePublicURL for `up`, under PublicURL for a host alone.
	ExposureDomain string
	// ExposureListen, for `up` without an ExposureDomain, is the TCP
	// address of the listener that serves exposures' path URLs, apart from
	// Listen so that guest pages never share an origin with the API and
	// the web console; empty is Listen's address with the next port
	// (exposureAddress).
	ExposureListen string
	// ExposurePublicURL is the URL callers reach ExposureListen at; empty
	// derives it as PublicURL does.
	ExposurePublicURL string
	// ConsoleOrigins, with a host agent here, are the origins whose pages
	// may call the data-plane gateway from a browser (CORS); nil allows
	// the control plane's public origin (PublicURL's for `up`, CtrlURL's
	// for a host alone).
	ConsoleOrigins []string
	// UnsafeExemptRanges exempts addresses from the special-purpose check
	// of Egress endpoints. Only for local testing.
	UnsafeExemptRanges []netip.Prefix
	// Resolver resolves Egress endpoint hostnames; nil uses the system's.
	Resolver netcheck.Resolver
	// Out receives the bootstrap admin token when one is created.
	Out io.Writer
	// Ready, when set, is called with the listening address once the
	// server accepts calls.
	Ready func(net.Addr)
	// Host runs a host agent in this process (`kibotos up`), so that the
	// deployment runs workspaces on this machine.
	Host bool
	// GuestAgent is the kibotos-guest binary; empty looks next to this
	// executable.
	GuestAgent string
	// Busybox is the static busybox the built-in template is made of.
	Busybox string
	// Runtime selects the OCI runtime of the host agent ("runc" default).
	Runtime string
	// GuestTmpfsPercent sizes a workspace's /tmp and /run, each, in
	// percent of its memory limit; zero is oci.DefaultGuestTmpfsPercent.
	GuestTmpfsPercent int
	// GuestConnections bounds each workspace's TCP connections its
	// network slot carries at once; zero is netslot.DefaultMaxFlows.
	GuestConnections int
	// WarmPool is how many workspaces the host agent keeps started ahead
	// of time (agent.Config.WarmPool); zero keeps none.
	WarmPool int
	// Overcommit is how many times its cores and its memory the host
	// offers to placement; zero fields are DefaultOvercommit's.
	Overcommit Overcommit
	// GuestProbeInterval is how often the host agent probes each running
	// guest; zero is agent.DefaultGuestProbeInterval.
	GuestProbeInterval time.Duration
	// GuestMemory says when a guest's memory is saturated and when its
	// largest process is killed; zero fields are psi.DefaultThresholds'.
	GuestMemory psi.Thresholds
	// DeploymentResolvers answer workspaces' DNS under PUBLIC_INTERNET when
	// their policy names no Resolver; nil reads /etc/resolv.conf.
	DeploymentResolvers []netip.AddrPort
	// StoragePools are the host's storage pools (NAME=DIR); nil gives one
	// pool, "default", under Home/volumes. The default pool of the
	// deployment is the one named "default", else the first.
	StoragePools []string
	// VolumeBytes is the storage profile of every pool: the capacity of a
	// Volume created without one; zero is DefaultVolumeBytes.
	VolumeBytes uint64
	// MaxLayerBytes bounds the file content of one template layer the host
	// unpacks; zero is imagestore.DefaultMaxLayerBytes.
	MaxLayerBytes uint64
	// DesktopCache, when set, is the directory of the desktop template's
	// image (imagestore.DesktopCacheDir for `kibotos up`): once serving,
	// the deployment builds it there unless it is built (minutes, once per
	// machine), then makes sure of the built-in template desktop. Empty:
	// no desktop template.
	DesktopCache string
	// MetricsTokenFile, when set, names a file whose content (surrounding
	// white space removed) is the bearer token GET /metrics requires;
	// empty serves the metrics to anyone who reaches the listener.
	MetricsTokenFile string
	// BlobsURL is the blob store of transfer artifacts (see openBlobs);
	// empty is HOME/blobs, or, for a control plane without a home, no
	// transfers.
	BlobsURL string
	// TransferTTL is how long a transfer's artifact is kept; zero is
	// transfers.DefaultTTL.
	TransferTTL time.Duration
	// InsecureRegistries lists the registries (host:port) template pulls
	// reach over plain HTTP; every other registry is reached over HTTPS.
	InsecureRegistries []string
	// RegistryCAFile is a PEM file of certificate authorities trusted,
	// beside the system's, for registries template pulls reach over HTTPS.
	RegistryCAFile string
	// OTLPEndpoint, when set, is the OTLP/HTTP collector the traces of
	// the control plane and of the data-plane gateway are exported to
	// (see tracing.New).
	OTLPEndpoint string
	// PprofListen, when set, serves net/http/pprof on this address, which
	// must be a loopback one: the profiles show the process's internals.
	PprofListen string
	// AuthCacheTTL is how long an authenticated API token is trusted
	// without reading the store again (see server.Config).
	AuthCacheTTL time.Duration
	// CommandRetention is how long a command's idempotency record is
	// kept; zero is command.DefaultRetention.
	CommandRetention time.Duration
	// HostLease is how long a host may stay silent before it is LOST;
	// zero is workspaces.DefaultHostLease.
	HostLease time.Duration
	// TLSCert and TLSKey, both set, make the listener serve TLS with this
	// certificate (PEM files); the public URL's default scheme is then
	// https.
	TLSCert, TLSKey string
	// HostID names this process's host agent; empty is "local" for
	// `kibotos up`.
	HostID string
	// CtrlURL, TokenFile and CAFile are a lone host agent's (RunHost):
	// the control plane's URL, the file holding its host token, and PEM
	// certificate authorities it trusts beside the system's for https.
	CtrlURL, TokenFile, CAFile string
}

// Run serves until ctx ends.
func Run(ctx context.Context, o Options) error {
	b := buildinfo.Get()
	slog.Info("kibotos starting", "version", b.Version, "commit", b.Commit, "go_version", b.GoVersion, "store", storeKind(o))
	if err := checkListen(o.Listen); err != nil {
		return err
	}
	if err := checkExposureOrigin(o); err != nil {
		return err
	}
	if err := o.absoluteHome(); err != nil {
		return err
	}
	metricsToken, err := readMetricsToken(o.MetricsTokenFile)
	if err != nil {
		return err
	}
	var registryCAs *x509.CertPool
	if o.RegistryCAFile != "" {
		cfg, err := cafile.Load(o.RegistryCAFile)
		if err != nil {
			return fmt.Errorf("registry CA file: %w", err)
		}
		registryCAs = cfg.RootCAs
	}
	tp, stopTracing, err := startTracing(o.OTLPEndpoint)
	if err != nil {
		return err
	}
	defer stopTracing()
	var tracer connect.Interceptor
	if tp != nil {
		if tracer, err = tp.Interceptor(); err != nil {
			return err
		}
	}
	pprofLn, err := listenPprof(o.PprofListen)
	if err != nil {
		return err
	}
	if pprofLn != nil {
		defer pprofLn.Close()
	}
	st, err := openStore(ctx, o)
	if err != nil {
		return err
	}
	defer st.Close()

	if len(o.UnsafeExemptRanges) > 0 {
		slog.Warn("UNSAFE: Egress endpoints and guests' direct traffic in these ranges are exempt from the special-purpose check; never use this in production",
			"ranges", fmt.Sprint(o.UnsafeExemptRanges))
	}
	if err := checkExposureDomain(o.ExposureDomain); err != nil {
		return err
	}
	if err := bootstrap(ctx, st, o); err != nil {
		return err
	}
	images, err := imagestore.Open(filepath.Join(o.stateDir(), "templates"))
	if err != nil {
		return err
	}
	if err := templates.EnsureBuiltin(ctx, st, images, o.busybox()); err != nil {
		return fmt.Errorf("built-in template: %w", err)
	}
	hostToken, err := secretSetting(ctx, st, hostTokenSetting)
	if err != nil {
		return err
	}
	var blobs *blob.Bucket
	if o.BlobsURL != "" || o.Home != "" || o.StoreURL == "" {
		if blobs, err = openBlobs(ctx, o); err != nil {
			return fmt.Errorf("blob store: %w", err)
		}
		defer blobs.Close()
		if err := claimBlobs(ctx, st, blobs, o.BlobsURL); err != nil {
			return err
		}
	}
	started := time.Now()
	reg := newRegistry()
	ln, cert, err := listen(o)
	if err != nil {
		return err
	}
	url := scheme(cert) + "://" + ln.Addr().String()
	public, err := PublicURL(o.PublicURL, ln.Addr(), cert != nil)
	if err != nil {
		ln.Close()
		return err
	}
	var (
		hostAgent      *agent.Agent
		exposureLn     net.Listener
		exposurePublic string
	)
	if o.Host {
		// Exposures' path URLs get a listener, and so an origin, of their
		// own: a guest page on this one could read the web console's token
		// or register a service worker over the console.
		if o.ExposureDomain == "" {
			if exposureLn, exposurePublic, err = listenExposures(o, cert); err != nil {
				ln.Close()
				return err
			}
			defer exposureLn.Close()
		}
		lock, err := lockHostHome(o.stateDir())
		if err != nil {
			ln.Close()
			return err
		}
		defer lock.Close()
		// The in-process host agent reaches ctrl through the host API on
		// this same listener, and serves its data-plane gateway (and
		// host-named exposures) on it, at the public URL.
		if hostAgent, err = newHostAgent(o, images, selfClient(cert), url, public, exposurePublic, bearer.Token(hostToken), reg); err != nil {
			ln.Close()
			return err
		}
	}
	checker := &netcheck.Checker{Resolver: o.Resolver, Exempt: o.UnsafeExemptRanges}
	// On PostgreSQL other replicas may share the store: changes cross
	// between them by LISTEN/NOTIFY.
	var relay *pgnotify.Relay
	broker := changes.NewBroker()
	if o.StoreURL != "" {
		relay = pgnotify.New(o.StoreURL)
		broker = relay.Broker()
	}
	ctl, err := server.New(ctx, server.Config{
		Store:   st,
		Checker: checker,
		Changes: broker,
		// Registries are dialed under the range check of every endpoint
		// the deployment reaches.
		Registry: &registry.Puller{Check: checker.CheckAddr, Resolver: o.Resolver, Insecure: o.InsecureRegistries, RootCAs: registryCAs,
			UserAgent: "kibotos/" + buildinfo.Version()},
		Images:    images,
		HostToken: hostToken,
		// With a host agent here, its pools name the deployment's default;
		// a lone ctrl keeps the built-in name.
		DefaultStoragePool: defaultPool(o),
		Metrics:            reg,
		MetricsToken:       metricsToken,
		Blobs:              blobs,
		TemplateBlobs:      templateBlobs(o, blobs),
		TransferTTL:        o.TransferTTL,
		Ready:              readiness(hostAgent),
		Tracing:            tracer,
		AuthCacheTTL:       o.AuthCacheTTL,
		HostLease:          o.HostLease,
		CallsPerCaller:     connectionLimit() / callerShare,
	})
	if err != nil {
		ln.Close()
		return err
	}
	slog.Info("control plane serving", "addr", ln.Addr().String(), "public_url", public, "store", storeKind(o))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	handler := ctl.Handler
	if hostAgent != nil {
		// The data-plane gateway authenticates with session tokens and the
		// exposures with theirs, not with the control plane's interceptor.
		// Exposures come first: a host name under the exposure domain is
		// the guest's whatever the path.
		gateway, exposures := hostAgent.Gateway(), hostAgent.Exposures()
		if tp != nil {
			gateway = tp.Handler(gateway)
		}
		gateway = agent.AllowOrigins(gateway, consoleOrigins(o.ConsoleOrigins, public))
		if exposureLn != nil {
			onlyThem := onlyExposures(hostAgent, exposures)
			g.Go(func() error { return server.Serve(ctx, exposureLn, admission.Guard(onlyThem), shutdownGrace) })
			exposures = movedTo(exposurePublic)
		}
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case hostAgent.ServesExposure(r):
				exposures.ServeHTTP(w, r)
			case strings.HasPrefix(r.URL.Path, agent.DataPlanePrefix):
				gateway.ServeHTTP(w, r)
			default:
				ctl.Handler.ServeHTTP(w, r)
			}
		})
	}
	// Whatever a request names, its body must come within
	// admission.BodyTimeout unless a handler admits it.
	g.Go(func() error { return server.Serve(ctx, ln, admission.Guard(handler), shutdownGrace) })
	if pprofLn != nil {
		slog.Info("serving pprof", "addr", pprofLn.Addr().String())
		g.Go(func() error { return server.Serve(ctx, pprofLn, pprofHandler(), shutdownGrace) })
	}
	if relay != nil {
		g.Go(func() error {
			relay.Run(ctx)
			return nil
		})
	}
	g.Go(func() error { return expireLoop(ctx, ctl) })
	g.Go(func() error { return templates.CollectLoop(ctx, st, images) })
	g.Go(func() error {
		retention := o.CommandRetention
		if retention <= 0 {
			retention = command.DefaultRetention
		}
		command.PruneLoop(ctx, st, retention)
		return nil
	})
	if ctl.Transfers != nil {
		g.Go(func() error {
			// With SQLite this process is the deployment's only ctrl: an
			// import stored before it started lost its upload with the
			// process before.
			if o.StoreURL == "" {
				if err := ctl.Transfers.Sweep(ctx, started); err != nil {
					slog.Error("transfers: first sweep", "err", err)
				}
			}
			ctl.Transfers.Run(ctx, transferSweepEvery)
			return nil
		})
	}
	if o.DesktopCache != "" {
		g.Go(func() error {
			provideDesktop(ctx, st, images, o.DesktopCache)
			return nil
		})
	}
	if hostAgent != nil {
		g.Go(func() error { return hostAgent.Run(ctx) })
		select {
		case <-hostAgent.Serving():
		case <-ctx.Done():
		}
	}
	slog.Info("ready", "addr", ln.Addr().String())
	if o.Ready != nil {
		o.Ready(ln.Addr())
	}
	err = g.Wait()
	slog.Info("control plane stopped")
	return err
}

// readiness returns the readiness checks of the process beyond the
// store's: with a host agent here, that it has registered and serves
// (ctrl does not refuse it, and it is not fenced).
func readiness(h *agent.Agent) []health.Check {
	if h == nil {
		return nil
	}
	return []health.Check{{Name: "host", Func: func(context.Context) error {
		select {
		case <-h.Registered():
		default:
			return errors.New("the host agent has not registered with the control plane yet")
		}
		if why := h.OutOfService(); why != "" {
			return errors.New("the host serves nothing: " + why)
		}
		return nil
	}}}
}

// newRegistry returns the deployment's metrics registry with the Go
// runtime's and the process's own metrics on it.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// readMetricsToken reads the token of GET /metrics from path; an empty
// path gives none (the metrics are open), an empty file is an error.
func readMetricsToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	return readSecretFile("metrics token", path)
}

// expireLoop makes hosts whose lease ran out LOST and applies expiration
// policies once a second, and forgets expired data-plane sessions once a
// minute. Every replica runs it: each pass is one transaction that
// changes only what is still due.
func expireLoop(ctx context.Context, ctl *server.Control) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := ctl.Workspaces.ExpireLeases(ctx); err != nil && ctx.Err() == nil {
			slog.Error("host leases", "err", err)
		}
		if err := ctl.Workspaces.Expire(ctx); err != nil && ctx.Err() == nil {
			slog.Error("expiration", "err", err)
		}
		if n%60 == 0 && ctl.Sessions != nil {
			if _, err := ctl.Sessions.Prune(ctx); err != nil && ctx.Err() == nil {
				slog.Error("pruning sessions", "err", err)
			}
		}
	}
}

// PublicURL returns the URL callers reach a listener at: configured when
// set (an absolute http or https URL without query or fragment; a trailing
// slash is dropped), else http://ADDR (https:// when the listener serves
// TLS) of the listening address, where an unspecified address (0.0.0.0,
// ::) becomes the machine's host name.
func PublicURL(configured string, addr net.Addr, tls bool) (string, error) {
	if configured != "" {
		u, err := neturl.Parse(configured)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
			return "", fmt.Errorf("public URL %q: want an absolute http:// or https:// URL without user, query or fragment", configured)
		}
		return strings.TrimSuffix(configured, "/"), nil
	}
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return "", fmt.Errorf("listening address %s: %w", addr, err)
	}
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	if !ap.Addr().IsUnspecified() {
		return scheme + ap.String(), nil
	}
	name, err := os.Hostname()
	if err != nil || name == "" {
		return "", fmt.Errorf("listening on %s: set a public URL, the host name is unknown: %v", addr, err)
	}
	return scheme + net.JoinHostPort(name, strconv.Itoa(int(ap.Port()))), nil
}

// dnsLabel is one label of an exposure domain.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// checkExposureDomain refuses an exposure domain that is not a lowercase
// DNS name of at least two labels.
func checkExposureDomain(domain string) error {
	if domain == "" {
		return nil
	}
	labels := strings.Split(domain, ".")
	ok := len(labels) >= 2 && len(domain) <= 253-64
	for _, l := range labels {
		ok = ok && dnsLabel.MatchString(l)
	}
	if !ok {
		return fmt.Errorf("exposure domain %q: want a lowercase DNS name of two labels or more, such as apps.example.com", domain)
	}
	return nil
}

// stateDir is where files other than the database live.
// absoluteHome makes Home absolute: what is under it is named by absolute
// paths (the storage pools', the guests' mounts).
func (o *Options) absoluteHome() error {
	if o.Home == "" {
		return nil
	}
	home, err := filepath.Abs(o.Home)
	o.Home = home
	return err
}

func (o Options) stateDir() string {
	if o.Home != "" {
		return o.Home
	}
	return DefaultHome
}

func (o Options) busybox() string {
	if o.Busybox != "" {
		return o.Busybox
	}
	return "/bin/busybox"
}

// hostTokenSetting names the secret host agents authenticate with.
const hostTokenSetting = "host_token"

// secretSetting returns a deployment secret, creating it once.
func secretSetting(ctx context.Context, st store.Store, key string) (string, error) {
	return settingOrNew(ctx, st, key, func() string {
		b := make([]byte, 32)
		rand.Read(b)
		return base64.RawURLEncoding.EncodeToString(b)
	})
}

// settingOrNew returns a setting of the store, storing newValue() first
// when it has none.
func settingOrNew(ctx context.Context, st store.Store, key string, newValue func() string) (string, error) {
	var v []byte
	err := st.Update(ctx, func(tx store.Tx) error {
		var err error
		if v, err = tx.Setting(ctx, key); !errors.Is(err, store.ErrNotFound) {
			return err
		}
		v = []byte(newValue())
		return tx.PutSetting(ctx, key, v)
	})
	return string(v), err
}

func storeKind(o Options) string {
	if o.StoreURL == "" {
		return "sqlite"
	}
	return "postgres"
}

func openStore(ctx context.Context, o Options) (store.Store, error) {
	switch {
	case o.StoreURL == "":
		if o.Home == "" {
			return nil, errors.New("a home directory or a store URL is required")
		}
		if err := os.MkdirAll(o.Home, 0o700); err != nil {
			return nil, err
		}
		return sqlite.Open(ctx, filepath.Join(o.Home, "kibotos.db"))
	case strings.HasPrefix(o.StoreURL, "postgres://"), strings.HasPrefix(o.StoreURL, "postgresql://"):
		return postgres.Open(ctx, o.StoreURL)
	}
	return nil, fmt.Errorf("store URL %q: only postgres:// URLs are supported (the embedded SQLite store is `kibotos up`)", redactURL(o.StoreURL))
}

// redactURL drops anything before an @, which may be a password.
func redactURL(u string) string {
	if at := strings.LastIndexByte(u, '@'); at >= 0 {
		if scheme := strings.Index(u, "://"); scheme >= 0 && scheme < at {
			return u[:scheme+3] + "…" + u[at:]
		}
	}
	return u
}

// bootstrap creates the first admin token of a new deployment, prints it
// once, and keeps it in Home/admin-token for the CLI.
func bootstrap(ctx context.Context, st store.Store, o Options) error {
	var keep func(string) error
	if o.Home != "" {
		keep = func(secret string) error { return keepAdminToken(o.Home, secret) }
	}
	secret, err := auth.Bootstrap(ctx, st, time.Now().UTC(), keep)
	if err != nil || secret == "" {
		return err
	}
	if o.Out != nil {
		fmt.Fprintf(o.Out, "Admin token of the new deployment (shown once):\n%s\n", secret)
	}
	if o.Home != "" {
		slog.Info("admin token kept for the CLI", "file", filepath.Join(o.Home, AdminTokenFile))
	}
	return nil
}

// keepAdminToken writes the bootstrap admin token to home/AdminTokenFile,
// mode 0600, and syncs it, before the token is committed (Bootstrap).
func keepAdminToken(home, secret string) error {
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	path := filepath.Join(home, AdminTokenFile)
	// Remove a stale file first: an existing file keeps its mode.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("write admin token: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write admin token: %w", err)
	}
	_, err = f.WriteString(secret + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(home)
	}
	if err != nil {
		return fmt.Errorf("write admin token: %w", err)
	}
	return nil
}

// syncDir makes the entries of dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// provideDesktop makes sure of the built-in template desktop, building its
// image in cacheDir first when none is built there. Failures are logged:
// the deployment serves without the template.
func provideDesktop(ctx context.Context, st store.Store, images *imagestore.Store, cacheDir string) {
	err := templates.EnsureDesktop(ctx, st, images, cacheDir)
	if errors.Is(err, os.ErrNotExist) {
		slog.Info("building the desktop template's image; the first build takes about 8 minutes", "dir", imagestore.DesktopImageDir(cacheDir))
		// The builder's output becomes log records, so that JSON logs stay
		// one object per line.
		out := &logging.LineWriter{Level: slog.LevelInfo, Msg: "desktop build"}
		_, err = imagestore.BuildDesktopImage(ctx, cacheDir, out)
		out.Close()
		if err == nil {
			err = templates.EnsureDesktop(ctx, st, images, cacheDir)
		}
	}
	switch {
	case ctx.Err() != nil:
	case err != nil:
		slog.Warn("no desktop template", "err", err)
	default:
		slog.Info("the built-in template desktop is ready")
	}
}

// startTracing returns the provider exporting to endpoint, nil for none,
// and the function that exports its last spans and stops it.
func startTracing(endpoint string) (*tracing.Provider, func(), error) {
	if endpoint == "" {
		return nil, func() {}, nil
	}
	tp, err := tracing.New(endpoint)
	if err != nil {
		return nil, nil, err
	}
	slog.Info("exporting traces", "otlp_endpoint", endpoint)
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			slog.Warn("exporting the last traces", "err", err)
		}
	}, nil
}
