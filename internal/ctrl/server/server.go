// Package server assembles ctrl's HTTP surface: the Connect handlers of
// every service behind the auth interceptor, gRPC health and reflection,
// the deployment's metrics at GET /metrics, and the web console at / and
// /assets/ (internal/ctrl/console), on one listener that speaks HTTP/1.1 and cleartext HTTP/2, so Connect
// (JSON and binary), gRPC and gRPC-Web all work on one port.
package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus"
	"gocloud.dev/blob"

	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/callshare"
	"github.com/kibotos/kibotos/internal/ctrl/accesslog"
	"github.com/kibotos/kibotos/internal/ctrl/api"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/console"
	"github.com/kibotos/kibotos/internal/ctrl/exposures"
	"github.com/kibotos/kibotos/internal/ctrl/health"
	"github.com/kibotos/kibotos/internal/ctrl/metrics"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/projects"
	"github.com/kibotos/kibotos/internal/ctrl/sessions"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/ctrl/transfers"
	"github.com/kibotos/kibotos/internal/ctrl/upstreams"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/errdetail"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// HandlerOptions are the options every service of the control plane is
// served with, before its interceptors: the codecs (with their bound on
// a request's elements), the request size bound, when answers are compressed, and the recovery of a panic.
func HandlerOptions() []connect.HandlerOption {
	return []connect.HandlerOption{
		codecs(maxRequestElements),
		connect.WithReadMaxBytes(MaxRequestBytes),
		// Compressing a small answer costs more CPU than the bytes it saves.
		connect.WithCompressMinBytes(compressMinBytes),
		connect.WithRecover(func(_ context.Context, _ connect.Spec, _ http.Header, r any) error {
			return accesslog.Internal(fmt.Errorf("handler panic: %v", r))
		}),
	}
}

// MaxRequestBytes bounds one request message.
const MaxRequestBytes = 8 << 20

// compressMinBytes is the smallest answer sent compressed to a caller that
// accepts compression.
const compressMinBytes = 4 << 10

// pageTokenKeySetting names the deployment key that signs page tokens.
const pageTokenKeySetting = "page_token_key"

// Config is what a control plane serves from.
type Config struct {
	Store store.Store
	// Checker range-checks Egress endpoints; its Exempt list is the
	// operator-only unsafe exemption.
	Checker *netcheck.Checker
	// Changes wakes watchers of workspaces; nil makes one.
	Changes *changes.Broker
	// Images is the template image store; nil serves no workspaces or
	// templates.
	Images *imagestore.Store
	// HostToken authenticates host agents on the host API.
	HostToken string
	// DefaultStoragePool is the pool a Volume request without one
	// selects; empty is DefaultStoragePool.
	DefaultStoragePool string
	// Metrics is the deployment's registry: the control plane puts its
	// metrics on it and serves everything on it at GET /metrics. Nil makes
	// one for the control plane alone.
	Metrics *prometheus.Registry
	// MetricsToken, when set, is the bearer token GET /metrics requires;
	// empty serves the metrics to anyone who reaches the listener.
	MetricsToken string
	// Blobs is the blob store of transfer artifacts; nil serves no
	// transfers.
	Blobs *blob.Bucket
	// TemplateBlobs, when set, is the deployment's blob store that every
	// replica keeps template blobs in (templates.Blobs); nil keeps them in
	// Images alone, for a deployment of one ctrl.
	TemplateBlobs *blob.Bucket
	// TransferTTL is how long an artifact is kept; zero is
	// transfers.DefaultTTL.
	TransferTTL time.Duration
	// Registry pulls template images by reference; nil refuses registry
	// imports (unavailable).
	Registry templates.Puller
	// Logger receives the access log and internal errors; nil is
	// slog.Default().
	Logger *slog.Logger
	// Tracing, when set, is the first interceptor of every API call
	// (tracing.Provider's: a span per call).
	Tracing connect.Interceptor
	// Ready are readiness checks of GET /readyz besides the store's (a
	// host agent in this process has registered, ...).
	Ready []health.Check
	// AuthCacheTTL is how long an authenticated token is trusted without
	// reading the store again, and so how long a revoked token may still
	// be accepted; zero is auth.DefaultCacheTTL, negative reads the store
	// on every call.
	AuthCacheTTL time.Duration
	// HostLease is how long a host may stay silent before it is LOST;
	// zero is workspaces.DefaultHostLease.
	HostLease time.Duration
	// CallsPerCaller bounds the calls in flight of one project, or of one
	// host token, on the API (auth.Gate); zero bounds none.
	CallsPerCaller int
}

// DefaultStoragePool is the name of the default storage pool when the
// deployment names none.
const DefaultStoragePool = "default"

// Control is the assembled control plane.
type Control struct {
	Handler    http.Handler
	Workspaces *workspaces.Service
	// Sessions is nil when the control plane serves no workspaces.
	Sessions *sessions.Service
	// Transfers is nil when the control plane serves no transfers; its
	// loop (Run) is the caller's to run.
	Transfers *transfers.Service
}

// Handler returns the HTTP handler of the whole control plane. It creates
// the deployment's page-token key on first use.
func Handler(ctx context.Context, cfg Config) (http.Handler, error) {
	c, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return c.Handler, nil
}

// New assembles the control plane.
func New(ctx context.Context, cfg Config) (*Control, error) {
	key, err := pageTokenKey(ctx, cfg.Store)
	if err != nil {
		return nil, err
	}
	if cfg.Changes == nil {
		cfg.Changes = changes.NewBroker()
	}
	pages := pagetoken.New(key)
	defaultPool := cfg.DefaultStoragePool
	if defaultPool == "" {
		defaultPool = DefaultStoragePool
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	calls, err := metrics.NewCalls(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	if err := metrics.RegisterBuildInfo(cfg.Metrics); err != nil {
		return nil, err
	}
	vols := &volumes.Service{Store: cfg.Store, Pages: pages, DefaultPool: defaultPool, InUse: workspaces.InUse, Changes: cfg.Changes}
	ws := &workspaces.Service{Store: cfg.Store, Pages: pages, Checker: cfg.Checker, Changes: cfg.Changes, Volumes: vols,
		HostLease: cfg.HostLease}
	if err := metrics.RegisterCensus(cfg.Metrics, ws.Census); err != nil {
		return nil, err
	}
	// Every call is counted (and traced), those the interceptors after
	// Calls refuse included.
	counted := connect.WithInterceptors(calls)
	if cfg.Tracing != nil {
		counted = connect.WithInterceptors(cfg.Tracing, calls)
	}
	common := HandlerOptions()
	// Callers authenticate with project tokens, host agents with the host
	// token. Each call is logged once, host agents' (frequent) at debug;
	// every refusal carries a FailureReason.
	authTTL := cfg.AuthCacheTTL
	if authTTL == 0 {
		authTTL = auth.DefaultCacheTTL
	}
	tokens := auth.NewCache(cfg.Store, authTTL)
	callerAuth := &auth.Interceptor{Tokens: tokens}
	hostAuth := api.HostAuth(cfg.HostToken, cfg.Store)
	callerLog := &accesslog.Interceptor{Logger: cfg.Logger, Level: slog.LevelInfo}
	hostLog := &accesslog.Interceptor{Logger: cfg.Logger, Level: slog.LevelDebug}
	opts := append([]connect.HandlerOption{counted, connect.WithInterceptors(errdetail.Interceptor(),
		callerLog, callerAuth, accesslog.Project(), nulRefusal{})}, common...)
	hostOpts := append([]connect.HandlerOption{counted, connect.WithInterceptors(errdetail.Interceptor(),
		hostLog, hostAuth, nulRefusal{})}, common...)
	hostOpts = append(hostOpts, codecs(maxHostRequestElements))
	// A service's handler, gated: no request of a caller whose token does
	// not authenticate is decoded but a small one (auth.Gate).
	var shares *callshare.Shares
	if cfg.CallsPerCaller > 0 {
		shares = callshare.New(cfg.CallsPerCaller)
	}
	mux := &gatedMux{ServeMux: http.NewServeMux(), check: callerAuth.Check, calls: shares, log: callerLog}
	hostMux := &gatedMux{ServeMux: mux.ServeMux, check: hostAuth.Check, calls: shares, log: hostLog}
	mux.Handle("GET "+metrics.Path, metrics.Handler(cfg.Metrics, cfg.MetricsToken))
	health.Register(mux.ServeMux, append([]health.Check{{Name: "store", Func: func(ctx context.Context) error {
		// The page-token key is read from the migrated schema.
		return unready(cfg.Store.View(ctx, func(tx store.Tx) error {
			_, err := tx.Setting(ctx, pageTokenKeySetting)
			return err
		}))
	}}}, cfg.Ready...))
	// The web console: a page that calls this same API from the browser.
	web := console.New()
	web.DataPlaneOrigins = ws.DataPlaneEndpoints
	mux.Handle("/{$}", web)
	mux.Handle(console.AssetsPrefix, web)
	mux.Handle(ctrlv1connect.NewEgressServiceHandler(api.NewEgressService(upstreams.NewEgresses(cfg.Store, pages, cfg.Checker, cfg.Changes)), opts...))
	mux.Handle(ctrlv1connect.NewResolverServiceHandler(api.NewResolverService(upstreams.NewResolvers(cfg.Store, pages, cfg.Changes)), opts...))
	sess := &sessions.Service{Store: cfg.Store, Workspaces: ws}
	mux.Handle(adminv1connect.NewAdminServiceHandler(api.NewAdminService(&projects.Service{Store: cfg.Store, Tokens: tokens}, vols, ws, sess), opts...))

	services := []string{
		ctrlv1connect.EgressServiceName,
		ctrlv1connect.ResolverServiceName,
		adminv1connect.AdminServiceName,
	}
	control := &Control{Handler: accesslog.Middleware(mux.ServeMux), Workspaces: ws}
	if cfg.Images != nil {
		shared := &templates.Blobs{Images: cfg.Images, Bucket: cfg.TemplateBlobs}
		tpl := &templates.Service{Store: cfg.Store, Images: cfg.Images, Shared: shared, Pages: pages, InUse: workspaces.InUse, Registry: cfg.Registry}
		mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(api.NewWorkspaceService(ws), opts...))
		mux.Handle(ctrlv1connect.NewVolumeServiceHandler(api.NewVolumeService(vols), opts...))
		mux.Handle(ctrlv1connect.NewTemplateServiceHandler(api.NewTemplateService(tpl), opts...))
		if cfg.Blobs != nil {
			tr := &transfers.Service{Store: cfg.Store, Pages: pages, Bucket: cfg.Blobs, Workspaces: ws, Templates: tpl, Changes: cfg.Changes, TTL: cfg.TransferTTL}
			ws.Exporting = transfers.Exporting
			mux.Handle(ctrlv1connect.NewTransferServiceHandler(api.NewTransferService(tr), opts...))
			services = append(services, ctrlv1connect.TransferServiceName)
			control.Transfers = tr
		}
		hostMux.Handle(hostv1connect.NewHostServiceHandler(api.NewHostService(ws, shared, control.Transfers), hostOpts...))
		mux.Handle(ctrlv1connect.NewSessionServiceHandler(api.NewSessionService(sess), opts...))
		exps := &exposures.Service{Store: cfg.Store, Workspaces: ws, Pages: pages}
		ws.Exposures = exps
		mux.Handle(ctrlv1connect.NewExposureServiceHandler(api.NewExposureService(exps), opts...))
		services = append(services, ctrlv1connect.WorkspaceServiceName, ctrlv1connect.VolumeServiceName, ctrlv1connect.TemplateServiceName,
			ctrlv1connect.SessionServiceName, ctrlv1connect.ExposureServiceName)
		control.Sessions = sess
	}
	mux.Handle(grpchealth.NewHandler(grpchealth.NewStaticChecker(services...), counted))
	reflector := grpcreflect.NewStaticReflector(services...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, counted))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, counted))
	return control, nil
}

// pageTokenKey returns the deployment's page-token key, creating it once.
// Every ctrl replica reads the same key from the shared store.
func pageTokenKey(ctx context.Context, s store.Store) ([]byte, error) {
	var key []byte
	err := s.Update(ctx, func(tx store.Tx) error {
		var err error
		key, err = tx.Setting(ctx, pageTokenKeySetting)
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		key = make([]byte, 32)
		rand.Read(key)
		return tx.PutSetting(ctx, pageTokenKeySetting, key)
	})
	if err != nil {
		return nil, fmt.Errorf("page token key: %w", err)
	}
	return key, nil
}

// Serve serves h on ln over HTTP/1.1 and cleartext HTTP/2 (HTTP/2 by ALPN on a TLS listener) until ctx ends,
// then stops accepting and lets calls in flight finish for up to grace.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration) error {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	protocols.SetHTTP2(true) // over a TLS listener, by ALPN
	srv := &http.Server{
		Handler:   h,
		Protocols: &protocols,
		// An uploaded file comes in 1 MiB messages (the data plane's
		// gateway serves here too); frames of that size carry one in a
		// frame instead of 64, and a stream may have a few in flight.
		HTTP2:             &http.HTTP2Config{MaxReadFrameSize: 1 << 20, MaxReceiveBufferPerStream: 4 << 20, MaxReceiveBufferPerConnection: 8 << 20},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	// A listener that bounds its connections learns which are idle, to
	// make room when it is full (daemon.limitedListener).
	if l, ok := ln.(interface {
		ConnState(net.Conn, http.ConnState)
	}); ok {
		srv.ConnState = l.ConnState
	}
	// Watches end when the shutdown begins (api.WithShutdown); calls in
	// flight have the grace period.
	shuttingDown := make(chan struct{})
	srv.BaseContext = func(net.Listener) context.Context { return api.WithShutdown(context.Background(), shuttingDown) }
	srv.RegisterOnShutdown(func() { close(shuttingDown) })
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// Calls still running after the grace period are cut off.
		slog.Warn("shutdown grace period over; closing remaining connections", "err", err)
		srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// unready says why the store check of readiness failed without the
// database's details (its user, name and address), which go to the log:
// /readyz answers without a token.
func unready(err error) error {
	if err == nil {
		return nil
	}
	slog.Warn("readiness: the store check failed", "err", err)
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return errors.New("the database does not answer")
	case errors.Is(err, store.ErrFull):
		return errors.New("the database's disk is full")
	}
	return errors.New("the database refused the check's read (the server log says why)")
}

// gatedMux is a ServeMux whose Handle serves a Connect service's handler
// (a path ending in "/") behind auth.Gate with check and calls, the calls
// it refuses logged by log; other paths as they are.
type gatedMux struct {
	*http.ServeMux
	check func(ctx context.Context, procedure, header string) (string, error)
	calls *callshare.Shares
	log   *accesslog.Interceptor
}

func (m *gatedMux) Handle(pattern string, h http.Handler) {
	if strings.HasSuffix(pattern, "/") && strings.HasPrefix(pattern, "/kibotos.") {
		h = auth.Gate(h, m.check, m.calls, func(r *http.Request, start time.Time, err error) error {
			return m.log.Refused(r.Context(), r.URL.Path, start, err)
		})
	}
	m.ServeMux.Handle(pattern, h)
}
