package daemon

// This file is `kibotos host`: a host agent alone, against a control
// plane elsewhere, with a listener of its own for its data-plane gateway
// and exposures.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/kibotos/kibotos/internal/admission"
	"github.com/kibotos/kibotos/internal/buildinfo"
	"github.com/kibotos/kibotos/internal/ctrl/health"
	"github.com/kibotos/kibotos/internal/ctrl/metrics"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/host/agent"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// RunHost runs one host agent against the control plane at o.CtrlURL,
// authenticated by the host token in o.TokenFile, with its state under
// o.Home (template layers, writable layers, volumes, runtime state,
// network namespaces: nothing another host on the same machine shares),
// until ctx ends. Its listener (o.Listen, TLS with o.TLSCert) serves the
// data-plane gateway and exposures at the public URL it registers, and the
// host's metrics at GET /metrics. With o.OTLPEndpoint, the gateway's calls
// are traced.
func RunHost(ctx context.Context, o Options) error {
	b := buildinfo.Get()
	slog.Info("kibotos starting", "version", b.Version, "commit", b.Commit, "go_version", b.GoVersion, "host", o.HostID)
	switch {
	case o.CtrlURL == "":
		return errors.New("the control plane's URL is required (--ctrl)")
	case o.Home == "":
		return errors.New("a home directory is required (--home)")
	case o.HostID == "":
		return errors.New("a host name is required (--name)")
	}
	if err := o.absoluteHome(); err != nil {
		return err
	}
	tp, stopTracing, err := startTracing(o.OTLPEndpoint)
	if err != nil {
		return err
	}
	defer stopTracing()
	token, err := newTokenFile(o.TokenFile)
	if err != nil {
		return err
	}
	metricsToken, err := readMetricsToken(o.MetricsTokenFile)
	if err != nil {
		return err
	}
	if err := checkExposureDomain(o.ExposureDomain); err != nil {
		return err
	}
	hc, err := ClientFor(o.CAFile)
	if err != nil {
		return err
	}
	// The first thing made in the home, once every setting was checked.
	lock, err := lockHostHome(o.Home)
	if err != nil {
		return err
	}
	defer lock.Close()
	images, err := imagestore.Open(filepath.Join(o.Home, "templates"))
	if err != nil {
		return err
	}
	reg := newRegistry()
	if err := metrics.RegisterBuildInfo(reg); err != nil {
		return err
	}
	ln, cert, err := listen(o)
	if err != nil {
		return err
	}
	public, err := PublicURL(o.PublicURL, ln.Addr(), cert != nil)
	if err != nil {
		ln.Close()
		return err
	}
	hostAgent, err := newHostAgent(o, images, hc, strings.TrimSuffix(o.CtrlURL, "/"), public, "", token, reg)
	if err != nil {
		ln.Close()
		return err
	}
	gateway, exposures, metricsHandler := hostAgent.Gateway(), hostAgent.Exposures(), metrics.Handler(reg, metricsToken)
	if tp != nil {
		gateway = tp.Handler(gateway)
	}
	gateway = agent.AllowOrigins(gateway, consoleOrigins(o.ConsoleOrigins, o.CtrlURL))
	// The probes, as ctrl serves them: ready once registered.
	probes := http.NewServeMux()
	health.Register(probes, readiness(hostAgent))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case hostAgent.ServesExposure(r):
			exposures.ServeHTTP(w, r)
		case strings.HasPrefix(r.URL.Path, agent.DataPlanePrefix):
			gateway.ServeHTTP(w, r)
		case r.Method == http.MethodGet && r.URL.Path == metrics.Path:
			metricsHandler.ServeHTTP(w, r)
		default:
			probes.ServeHTTP(w, r) // a 404 but for the probes
		}
	})
	slog.Info("host agent serving", "host", o.HostID, "addr", ln.Addr().String(), "public_url", public, "ctrl", o.CtrlURL)
	g, ctx := errgroup.WithContext(ctx)
	// Whatever a request names, its body must come within
	// admission.BodyTimeout unless the gateway or an exposure admits it.
	g.Go(func() error { return server.Serve(ctx, ln, admission.Guard(handler), shutdownGrace) })
	g.Go(func() error { return hostAgent.Run(ctx) })
	select {
	case <-hostAgent.Serving():
		slog.Info("ready", "addr", ln.Addr().String(), "host", o.HostID)
		if o.Ready != nil {
			o.Ready(ln.Addr())
		}
	case <-ctx.Done():
	}
	err = g.Wait()
	slog.Info("host agent stopped")
	return err
}

// readSecretFile reads a one-line secret (surrounding white space
// removed); what names it in errors.
func readSecretFile(what, path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("a %s file is required", what)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s file %s is empty", what, path)
	}
	return s, nil
}
