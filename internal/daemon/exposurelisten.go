package daemon

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/kibotos/kibotos/internal/exposureabi"
	"github.com/kibotos/kibotos/internal/host/agent"
)

// listenExposures opens the listener of exposures' path URLs in `up`
// (Options.ExposureListen, TLS as the main listener) and returns it with
// the URL callers reach it at.
func listenExposures(o Options, cert *tls.Certificate) (net.Listener, string, error) {
	addr := o.ExposureListen
	if addr == "" {
		var err error
		if addr, err = exposureAddress(o.Listen); err != nil {
			return nil, "", err
		}
	}
	ln, err := listenOn(addr, cert)
	if err != nil {
		return nil, "", fmt.Errorf("exposure listener (--exposure-listen): %w", err)
	}
	public, err := PublicURL(o.ExposurePublicURL, ln.Addr(), cert != nil)
	if err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("exposure public URL: %w", err)
	}
	return ln, public, nil
}

// checkExposureOrigin refuses `up` served at a public URL (behind a
// proxy) whose exposures' path URLs have no public URL of their own: they
// would name the exposure listener's own address, which callers behind
// the proxy cannot reach.
func checkExposureOrigin(o Options) error {
	if !o.Host || o.PublicURL == "" || o.ExposureDomain != "" || o.ExposurePublicURL != "" {
		return nil
	}
	return fmt.Errorf("--public-url %s is set, so exposures need a public URL of their own (their path URLs are not served on the API's origin): "+
		"set --exposure-public-url to the URL that reaches --exposure-listen, or --exposure-domain", o.PublicURL)
}

// exposureAddress is the default address of the exposure listener: the
// main listener's with the next port, or any free port when that one is
// chosen by the system (port 0).
func exposureAddress(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %w", listen, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 65535 {
		return "", fmt.Errorf("listen address %q: no next port for exposures; set --exposure-listen", listen)
	}
	if n > 0 {
		n++
	}
	return net.JoinHostPort(host, strconv.FormatUint(n, 10)), nil
}

// onlyExposures serves the exposure listener: exposures, and a 404 for
// anything else.
func onlyExposures(a *agent.Agent, exposures http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.ServesExposure(r) {
			http.Error(w, "This listener serves only exposures, at "+exposureabi.PathPrefix+"<exposure>/.", http.StatusNotFound)
			return
		}
		exposures.ServeHTTP(w, r)
	})
}

// movedTo redirects a request for a path URL on the main listener to the
// same path under the exposure listener's URL, base.
func movedTo(base string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, base+r.URL.RequestURI(), http.StatusPermanentRedirect)
	})
}
