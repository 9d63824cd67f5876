package agent

import (
	"context"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/admission"
	"github.com/kibotos/kibotos/internal/exposureabi"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// This file is the exposure proxy: it serves the URLs of the exposures
// ctrl assigned to this host's running executions and forwards each
// request, WebSocket included, to the guest port through the guest agent
// (DialGuestPort).

// exposureDialTimeout bounds connecting to a guest port.
const exposureDialTimeout = 10 * time.Second

// recheckExposureEvery is how often a request in flight (a long response, a
// WebSocket) checks that its exposure is still routed: a revoked exposure
// or a stopped execution cuts it within this period.
const recheckExposureEvery = 500 * time.Millisecond

// exposureRoute is one exposure a request reaches.
type exposureRoute struct {
	execution   string
	workspaceID string
	exposure    *hostv1.ExposureAssignment
	// prefix is the path prefix the guest does not see ("" when routed by
	// host name).
	prefix string
}

// routeKey carries a request's route to the transport's dial.
type routeKey struct{}

// ServesExposure reports whether a request is for the exposure proxy: its
// path is under exposureabi.PathPrefix, or its host is an exposure's host
// name under the host's exposure domain. Other requests (the Connect
// APIs) never match.
func (a *Agent) ServesExposure(r *http.Request) bool {
	if strings.HasPrefix(r.URL.Path, exposureabi.PathPrefix) {
		return true
	}
	_, _, ok := a.exposureHost(r.Host)
	return ok
}

// exposureHost parses a Host header of an exposure routed by host name.
func (a *Agent) exposureHost(hostport string) (port uint32, workspaceID string, ok bool) {
	if a.cfg.ExposureDomain == "" {
		return 0, "", false
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(host, "."+strings.ToLower(a.cfg.ExposureDomain))
	if !ok || strings.Contains(label, ".") {
		return 0, "", false
	}
	return exposureabi.ParseHostLabel(label)
}

// Exposures returns the host's exposure proxy, an http.Handler for the
// requests ServesExposure matches. A request reaches the guest port of a
// live exposure of an execution that runs here; otherwise it is a 404 page
// (an unknown, revoked or ended exposure, or one whose execution does not
// run here). Under TOKEN a request must carry the exposure's token as
// Authorization: Bearer, as the query parameter kibotos_token (which sets
// the exposure's cookie and, on GET and HEAD, redirects to the URL without
// it), or in that cookie; without one it is a 401 page and the guest sees
// nothing. A guest port that does not answer is a 502 page.
//
// The guest receives the request over HTTP/1.1 with X-Forwarded-For,
// X-Forwarded-Host, X-Forwarded-Proto (and X-Forwarded-Prefix under a path
// URL), without hop-by-hop headers, Forwarded or X-Real-Ip, and without the
// token: under TOKEN the Authorization header is removed, and the
// kibotos_token parameter (from the URL and the Referer) and the exposure
// cookie always are. Bodies stream both ways; WebSocket
// upgrades pass through. A request in flight ends within a second of its
// exposure being revoked or its execution stopping.
//
// At most maxExposureRequests requests are in flight through one exposure
// and maxExposureRequestsAll through all of the host's; one more is a 503
// page with Retry-After.
//
// Each call returns a new proxy with its own connections to guests: call
// it once.
func (a *Agent) Exposures() http.Handler {
	p := &exposureProxy{agent: a, https: strings.HasPrefix(a.cfg.DataPlaneEndpoint, "https:"),
		maxPerExposure: maxExposureRequests, maxAll: maxExposureRequestsAll, inFlight: map[string]int{}}
	transport := &http.Transport{
		// The URL host is <execution>:<port>, so that connections of one
		// execution are never reused for the next; the route in the
		// request's context names the workspace.
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			route, ok := ctx.Value(routeKey{}).(*exposureRoute)
			if !ok {
				return nil, fmt.Errorf("exposure proxy: no route to %s", addr)
			}
			ctx, cancel := context.WithTimeout(ctx, exposureDialTimeout)
			defer cancel()
			conn, err := a.DialGuestPort(ctx, route.workspaceID, route.exposure.Port)
			if err != nil {
				return nil, &portDialError{err}
			}
			return conn, nil
		},
		MaxIdleConnsPerHost:    64,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: maxGuestHeaderBytes,
		// The guest gets the caller's Accept-Encoding, not one of the
		// proxy's, and its encoding passes through.
		DisableCompression: true,
	}
	p.proxy = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      transport,
		ErrorHandler:   p.proxyError,
		ModifyResponse: dropTokenCookies,
	}
	return p
}

// maxExposureRequests and maxExposureRequestsAll bound the requests in
// flight through one exposure and through all of a host's. A guest's
// server that never answers holds every request sent to it (a caller's
// connection and a few goroutines on the host each): unbounded, one
// exposure's callers took the host process's file descriptors, which ctrl
// and every other workspace share.
const (
	maxExposureRequests    = 1024
	maxExposureRequestsAll = 4096
)

type exposureProxy struct {
	agent *Agent
	proxy *httputil.ReverseProxy
	// https is set when the host's public URL is https: the exposure
	// cookie is Secure and X-Forwarded-Proto says https.
	https bool

	maxPerExposure, maxAll int
	mu                     sync.Mutex
	inFlight               map[string]int // by exposure ID
	all                    int
}

// admit counts a request in flight through exposure id, or reports false
// when a bound is reached; release uncounts an admitted one.
func (p *exposureProxy) admit(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[id] >= p.maxPerExposure || p.all >= p.maxAll {
		return false
	}
	p.inFlight[id]++
	p.all++
	return true
}

func (p *exposureProxy) release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[id]--; p.inFlight[id] == 0 {
		delete(p.inFlight, id)
	}
	p.all--
}

func (p *exposureProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if why := p.agent.outOfService(); why != "" {
		page(w, http.StatusServiceUnavailable, "Out of service", "This host is out of service: "+why+".")
		return
	}
	route, ok := p.route(w, r)
	if !ok {
		return
	}
	if route.exposure.Auth != ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC && !p.authorize(w, r, route) {
		return
	}
	if !p.admit(route.exposure.ExposureId) {
		w.Header().Set("Retry-After", "1")
		page(w, http.StatusServiceUnavailable, "Too many requests", "This exposure, or this host's exposures, carry as many requests at once as they may. Try again shortly.")
		return
	}
	defer p.release(route.exposure.ExposureId)
	admission.Admit(w) // a guest's upload or WebSocket may take as long as it takes
	ctx, cancel := whileValid(context.WithValue(r.Context(), routeKey{}, route), recheckExposureEvery, func() bool {
		now := p.agent.exposureByID(route.exposure.ExposureId)
		return now != nil && now.execution == route.execution
	})
	defer cancel()
	p.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// route finds the exposure a request is for, or answers it.
func (p *exposureProxy) route(w http.ResponseWriter, r *http.Request) (*exposureRoute, bool) {
	if port, workspaceID, ok := p.agent.exposureHost(r.Host); ok {
		if route := p.agent.exposureByPort(workspaceID, port); route != nil {
			return route, true
		}
		page(w, http.StatusNotFound, "No such exposure", "Nothing is exposed at this address: the exposure was revoked, ended with its workspace's execution, or never existed.")
		return nil, false
	}
	if p.agent.cfg.ExposureDomain != "" {
		// The domain gives each exposure an origin of its own; a path URL
		// would put guest pages in the listener's.
		page(w, http.StatusNotFound, "No such exposure", "This host serves exposures at their host names under "+p.agent.cfg.ExposureDomain+", not at path URLs.")
		return nil, false
	}
	rest := strings.TrimPrefix(r.URL.Path, exposureabi.PathPrefix)
	id, _, slash := strings.Cut(rest, "/")
	route := p.agent.exposureByID(id)
	if route == nil {
		page(w, http.StatusNotFound, "No such exposure", "Nothing is exposed at this address: the exposure was revoked, ended with its workspace's execution, or never existed.")
		return nil, false
	}
	route.prefix = exposureabi.PathPrefix + id
	if !slash {
		// The guest's relative links resolve under the prefix only with
		// the slash.
		u := *r.URL
		u.Path, u.RawPath = route.prefix+"/", ""
		http.Redirect(w, r, u.RequestURI(), http.StatusPermanentRedirect)
		return nil, false
	}
	return route, true
}

// authorize checks a TOKEN exposure's token, from the query parameter,
// the Authorization header or the cookie, and answers a request without a
// valid one (401) or one that carried it in the query (the cookie, and a
// redirect on GET and HEAD).
func (p *exposureProxy) authorize(w http.ResponseWriter, r *http.Request, route *exposureRoute) bool {
	x := route.exposure
	valid := func(tok string) bool { return exposureabi.Verify(tok, x.ExposureId, x.TokenSha256) }
	if tok := r.URL.Query().Get(exposureabi.TokenParameter); tok != "" {
		if !valid(tok) {
			unauthorized(w)
			return false
		}
		path := route.prefix
		if path == "" {
			path = "/"
		}
		http.SetCookie(w, &http.Cookie{Name: exposureabi.CookieName, Value: tok, Path: path,
			HttpOnly: true, Secure: p.https || r.TLS != nil, SameSite: http.SameSiteLaxMode})
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			w.Header().Set("Referrer-Policy", "no-referrer")
			u := *r.URL
			u.RawQuery = withoutParameter(u.RawQuery, exposureabi.TokenParameter)
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return false
		}
		return true
	}
	if token, ok := bearer.Parse(r.Header.Get("Authorization")); ok && valid(token) {
		return true
	}
	for _, c := range r.CookiesNamed(exposureabi.CookieName) {
		if valid(c.Value) {
			return true
		}
	}
	unauthorized(w)
	return false
}

// rewrite addresses the request to the guest port and takes from it what
// is nobody else's business.
func (p *exposureProxy) rewrite(pr *httputil.ProxyRequest) {
	route := pr.In.Context().Value(routeKey{}).(*exposureRoute)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = route.execution + ":" + strconv.FormatUint(uint64(route.exposure.Port), 10)
	pr.Out.Host = pr.In.Host // the guest sees the name it was called by
	if route.prefix != "" {
		pr.Out.URL.Path = strings.TrimPrefix(pr.Out.URL.Path, route.prefix)
		pr.Out.URL.RawPath = strings.TrimPrefix(pr.Out.URL.RawPath, route.prefix)
		if !strings.HasPrefix(pr.Out.URL.RawPath, "/") {
			// The slash after the ID came escaped (%2F): what is left of
			// the raw path is no path, so the guest gets the decoded one.
			pr.Out.URL.RawPath = ""
		}
		pr.Out.Header.Set("X-Forwarded-Prefix", route.prefix)
	}
	pr.Out.Header.Del("Forwarded")
	pr.Out.Header.Del("X-Real-Ip")
	pr.SetXForwarded()
	if p.https {
		pr.Out.Header.Set("X-Forwarded-Proto", "https")
	}
	pr.Out.URL.RawQuery = withoutParameter(pr.Out.URL.RawQuery, exposureabi.TokenParameter)
	// A client that followed the token's redirect names it as the
	// referrer; one that cannot be parsed may hold it where the parameter
	// cannot be found, and goes.
	if ref, err := url.Parse(pr.Out.Header.Get("Referer")); err != nil {
		pr.Out.Header.Del("Referer")
	} else if ref.RawQuery != "" {
		ref.RawQuery = withoutParameter(ref.RawQuery, exposureabi.TokenParameter)
		pr.Out.Header.Set("Referer", ref.String())
	}
	dropCookie(pr.Out.Header, exposureabi.CookieName)
	if route.exposure.Auth != ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC {
		pr.Out.Header.Del("Authorization")
	}
}

// proxyError answers a request whose guest port could not be reached, or
// whose exposure ended (revoked, or its execution stopped) while it was in
// flight.
func (p *exposureProxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	route := r.Context().Value(routeKey{}).(*exposureRoute)
	if now := p.agent.exposureByID(route.exposure.ExposureId); now == nil || now.execution != route.execution {
		// An answer, never nothing, which the server would send as 200 OK
		// (an upload cut short read as taken); and at once, closing the
		// connection, without waiting for the rest of a body still coming.
		w.Header().Set("Connection", "close")
		page(w, http.StatusNotFound, "Exposure ended", "This exposure ended while the request was in flight: it was revoked, or its workspace stopped. The request may have reached the server only in part.")
		rc := http.NewResponseController(w)
		rc.Flush()
		rc.SetReadDeadline(time.Now())
		return
	}
	if r.Context().Err() != nil {
		return // the caller left
	}
	slog.Info("exposure: no answer from the guest port", "exposure", route.exposure.ExposureId, "err", err)
	msg := fmt.Sprintf("Nothing answered on port %d of workspace %s. Start a server listening on that port in the workspace, then reload.",
		route.exposure.Port, route.workspaceID)
	if !errors.As(err, new(*portDialError)) {
		msg = fmt.Sprintf("The server on port %d of workspace %s accepted the connection but gave no HTTP response (%v). Is it an HTTP server?",
			route.exposure.Port, route.workspaceID, err)
	}
	page(w, http.StatusBadGateway, "Bad gateway", msg)
}

// portDialError is a failure to connect to the guest port, as opposed to
// one of the exchange once connected.
type portDialError struct{ err error }

func (e *portDialError) Error() string { return e.err.Error() }
func (e *portDialError) Unwrap() error { return e.err }

// exposureByID finds a live exposure of an execution running here.
func (a *Agent) exposureByID(id string) *exposureRoute {
	if id == "" {
		return nil
	}
	return a.findExposure(func(_ string, x *hostv1.ExposureAssignment) bool { return x.ExposureId == id })
}

// exposureByPort finds the live exposure of a workspace's port.
func (a *Agent) exposureByPort(workspaceID string, port uint32) *exposureRoute {
	return a.findExposure(func(ws string, x *hostv1.ExposureAssignment) bool { return ws == workspaceID && x.Port == port })
}

func (a *Agent) findExposure(match func(workspaceID string, x *hostv1.ExposureAssignment) bool) *exposureRoute {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, e := range a.execs {
		as, _ := e.get()
		if as == nil || as.Desired != hostv1.DesiredState_DESIRED_STATE_RUNNING {
			continue
		}
		for _, x := range as.Exposures {
			if !match(as.WorkspaceId, x) {
				continue
			}
			if last := e.lastReport(); last == nil || last.State != hostv1.ObservedState_OBSERVED_STATE_RUNNING || last.Generation != as.Generation {
				return nil // not running (yet): not routed
			}
			return &exposureRoute{execution: id, workspaceID: as.WorkspaceId, exposure: x}
		}
	}
	return nil
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="kibotos exposure"`)
	page(w, http.StatusUnauthorized, "Unauthorized", "This exposure needs its token: send Authorization: Bearer <token>, or open the URL once with ?"+
		exposureabi.TokenParameter+"=<token>.")
}

// page answers with a small HTML page.
func page(w http.ResponseWriter, status int, title, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!DOCTYPE html>\n<html><head><title>%d %s</title></head><body><h1>%d %s</h1><p>%s</p><p>kibotos</p></body></html>\n",
		status, html.EscapeString(title), status, html.EscapeString(title), html.EscapeString(msg))
}

// withoutParameter removes a parameter from a raw query, keeping the rest
// as it was written.
func withoutParameter(rawQuery, name string) string {
	if rawQuery == "" {
		return ""
	}
	var kept []string
	for part := range strings.SplitSeq(rawQuery, "&") {
		key, _, _ := strings.Cut(part, "=")
		if k, err := url.QueryUnescape(key); err == nil && k == name {
			continue
		}
		kept = append(kept, part)
	}
	return strings.Join(kept, "&")
}

// dropTokenCookies removes from a guest's answer each Set-Cookie that
// would set or clear an exposure's token cookie: path URLs share one
// origin, so a guest's page could otherwise replace another exposure's
// token in its callers' browsers (or its own), and a cookie's name is
// read as a browser reads it, blanks trimmed, in any case.
func dropTokenCookies(resp *http.Response) error {
	lines := resp.Header.Values("Set-Cookie")
	kept := make([]string, 0, len(lines))
	for _, line := range lines {
		pair, _, _ := strings.Cut(line, ";")
		name, _, _ := strings.Cut(pair, "=")
		if !strings.EqualFold(strings.TrimSpace(name), exposureabi.CookieName) {
			kept = append(kept, line)
		}
	}
	if len(kept) < len(lines) {
		resp.Header["Set-Cookie"] = kept
	}
	return nil
}

// dropCookie removes one cookie from a request's Cookie headers, keeping
// the others.
func dropCookie(h http.Header, name string) {
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var kept []string
	for _, line := range lines {
		for part := range strings.SplitSeq(line, ";") {
			// Names are compared as a cookie parser reads them, without
			// the spaces around them ("kibotos_exposure =TOKEN").
			if k, _, _ := strings.Cut(part, "="); strings.TrimSpace(k) != name && strings.TrimSpace(part) != "" {
				kept = append(kept, strings.TrimSpace(part))
			}
		}
	}
	h.Del("Cookie")
	if len(kept) > 0 {
		h.Set("Cookie", strings.Join(kept, "; "))
	}
}
