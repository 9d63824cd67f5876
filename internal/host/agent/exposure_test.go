package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/exposureabi"
	"github.com/kibotos/kibotos/internal/testutil"
)

// guestApp is an HTTP server on the test's loopback standing for a server
// in the guest (the fake driver's guest agent dials the loopback): it
// records every request it receives and answers with its path.
type guestApp struct {
	port uint32
	mu   sync.Mutex
	seen []*http.Request
}

func newGuestApp(t *testing.T) *guestApp {
	t.Helper()
	app := &guestApp{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		app.mu.Lock()
		app.seen = append(app.seen, r.Clone(context.Background()))
		app.mu.Unlock()
		if r.URL.Path == "/cookies" { // a page that would take other exposures' token cookies
			for _, c := range []string{"kibotos_exposure=planted; Path=/x/exp_other/", " Kibotos_Exposure =x; Path=/", "kibotos_exposure; Max-Age=0", "app=1; Path=/x/exp_t/"} {
				w.Header().Add("Set-Cookie", c)
			}
		}
		if r.URL.Path == "/stall" { // a server that never answers
			<-r.Context().Done()
			return
		}
		if r.URL.Path == "/stream" {
			// A response that runs until the proxy cuts it.
			w.WriteHeader(http.StatusOK)
			for {
				if _, err := io.WriteString(w, "tick\n"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s?%s %s", r.Method, r.URL.Path, r.URL.RawQuery, body)
	}))
	t.Cleanup(srv.Close)
	app.port = uint32(srv.Listener.Addr().(*net.TCPAddr).Port)
	return app
}

func (g *guestApp) requests() []*http.Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*http.Request(nil), g.seen...)
}

func exposed(as *hostv1.Assignment, xs ...*hostv1.ExposureAssignment) *hostv1.Assignment {
	as.Exposures = xs
	return as
}

func TestExposureProxy(t *testing.T) {
	e := newGatewayEnv(t)
	app := newGuestApp(t)
	token, sum := exposureabi.NewToken("exp_t")
	tokenX := &hostv1.ExposureAssignment{ExposureId: "exp_t", Port: app.port, Auth: ctrlv1.ExposureAuth_EXPOSURE_AUTH_TOKEN, TokenSha256: sum}
	publicX := &hostv1.ExposureAssignment{ExposureId: "exp_p", Port: 1, Auth: ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC}
	e.set(exposed(assignment("ws_a", 2, key(1)), tokenX, publicX), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	// ws_b's execution is not running: its exposure is not routed.
	e.set(exposed(assignment("ws_b", 1, key(2)), &hostv1.ExposureAssignment{ExposureId: "exp_b", Port: app.port,
		Auth: ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC}), hostv1.ObservedState_OBSERVED_STATE_STARTING)
	srv := testutil.H2CServer(t, e.agent.Exposures())
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, header http.Header, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header[k] = v
		}
		if h := header.Get("Host"); h != "" {
			req.Host = h
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	// Refused before the guest sees anything.
	for _, c := range []struct {
		name, path string
		header     http.Header
		status     int
	}{
		{"unknown exposure", "/x/exp_nope/", nil, http.StatusNotFound},
		{"not running", "/x/exp_b/", nil, http.StatusNotFound},
		{"no token", "/x/exp_t/page", nil, http.StatusUnauthorized},
		{"wrong token", "/x/exp_t/page", http.Header{"Authorization": {"Bearer exp_t.wrong"}}, http.StatusUnauthorized},
		{"another exposure's token", "/x/exp_t/page", http.Header{"Authorization": {"Bearer exp_p.x"}}, http.StatusUnauthorized},
		{"wrong query token", "/x/exp_t/page?kibotos_token=exp_t.x", nil, http.StatusUnauthorized},
		{"wrong cookie", "/x/exp_t/page", http.Header{"Cookie": {"kibotos_exposure=exp_t.x"}}, http.StatusUnauthorized},
	} {
		if resp, body := do("GET", c.path, c.header, ""); resp.StatusCode != c.status || !strings.Contains(body, "<h1>") {
			t.Errorf("%s: %d %q, want %d and a page", c.name, resp.StatusCode, body, c.status)
		}
	}
	if n := len(app.requests()); n != 0 {
		t.Fatalf("the guest saw %d refused requests", n)
	}
	if resp, _ := do("GET", "/x/exp_t?a=1", nil, ""); resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "/x/exp_t/?a=1" {
		t.Errorf("without the slash: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}

	// The header: the guest sees the path under the prefix, forwarding
	// headers, and no token.
	resp, body := do("POST", "/x/exp_t/api/items?q=1", http.Header{"Authorization": {"Bearer " + token},
		"Connection": {"X-Secret, close"}, "X-Secret": {"hop"}, "Forwarded": {"for=1.2.3.4"}, "X-Forwarded-For": {"1.2.3.4"}}, "data")
	if resp.StatusCode != http.StatusOK || body != "POST /api/items?q=1 data" {
		t.Fatalf("with the token: %d %q", resp.StatusCode, body)
	}
	seen := app.requests()[0]
	for name, want := range map[string]string{"Authorization": "", "X-Secret": "", "Forwarded": "",
		"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": strings.TrimPrefix(srv.URL, "http://"),
		"X-Forwarded-Prefix": "/x/exp_t"} {
		if got := seen.Header.Get(name); got != want {
			t.Errorf("the guest saw %s %q, want %q", name, got, want)
		}
	}

	// The query parameter once: a cookie scoped to the exposure and a
	// redirect without it; then the cookie alone, which never reaches the
	// guest, while the guest's own cookies do.
	resp, _ = do("GET", "/x/exp_t/page?a=1&kibotos_token="+token+"&b=2", nil, "")
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/x/exp_t/page?a=1&b=2" || len(cookies) != 1 ||
		cookies[0].Name != exposureabi.CookieName || cookies[0].Value != token || cookies[0].Path != "/x/exp_t" ||
		!cookies[0].HttpOnly || cookies[0].Secure || cookies[0].SameSite != http.SameSiteLaxMode {
		t.Fatalf("query token: %d to %q, cookies %v", resp.StatusCode, resp.Header.Get("Location"), cookies)
	}
	if resp.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Errorf("the token's redirect lets the browser send it as the referrer")
	}
	resp, body = do("GET", "/x/exp_t/page?a=1&b=2", http.Header{"Cookie": {"app=1; kibotos_exposure=" + token + "; theme=dark"},
		"Referer": {srv.URL + "/x/exp_t/page?a=1&kibotos_token=" + token}}, "")
	if resp.StatusCode != http.StatusOK || body != "GET /page?a=1&b=2 " {
		t.Fatalf("with the cookie: %d %q", resp.StatusCode, body)
	}
	if got := app.requests()[1].Header.Get("Cookie"); got != "app=1; theme=dark" {
		t.Errorf("the guest saw cookies %q", got)
	}
	// A cookie parser reads the name without spaces around it, and so
	// does the proxy that removes it.
	if resp, _ := do("GET", "/x/exp_t/spaced", http.Header{"Cookie": {"app=1; kibotos_exposure =" + token}}, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("with a spaced cookie: %d", resp.StatusCode)
	}
	if got := app.requests()[2].Header.Get("Cookie"); got != "app=1" {
		t.Errorf("the guest saw cookies %q", got)
	}
	if got := app.requests()[1].Header.Get("Referer"); got != srv.URL+"/x/exp_t/page?a=1" {
		t.Errorf("the guest saw the referrer %q", got)
	}
	// A POST carrying the parameter goes through, without it.
	if resp, body := do("POST", "/x/exp_t/form?kibotos_token="+token, nil, "x"); resp.StatusCode != http.StatusOK || body != "POST /form? x" {
		t.Errorf("POST with the query token: %d %q", resp.StatusCode, body)
	}
	// A referrer that cannot be parsed, which a browser keeps from a page
	// whose path has a stray %, may hold the token: it goes whole.
	if resp, _ := do("GET", "/x/exp_t/next", http.Header{"Cookie": {"kibotos_exposure=" + token},
		"Referer": {srv.URL + "/x/exp_t/%zz?kibotos_token=" + token}}, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("with an unparsable referrer: %d", resp.StatusCode)
	}
	if reqs := app.requests(); reqs[len(reqs)-1].Header.Get("Referer") != "" {
		t.Errorf("the guest saw the referrer %q", reqs[len(reqs)-1].Header.Get("Referer"))
	}
	// The guest's page sets its own cookies, never an exposure's token
	// cookie, which on path URLs would reach every exposure's callers.
	if resp, _ := do("GET", "/x/exp_t/cookies", http.Header{"Cookie": {"kibotos_exposure=" + token}}, ""); resp.StatusCode != http.StatusOK ||
		!slices.Equal(resp.Header.Values("Set-Cookie"), []string{"app=1; Path=/x/exp_t/"}) {
		t.Errorf("the guest's cookies: %d %q, want its own alone", resp.StatusCode, resp.Header.Values("Set-Cookie"))
	}
	// A slash after the exposure ID that came escaped still gives the
	// guest a path.
	if resp, body := do("GET", "/x/exp_t%2Fescaped", http.Header{"Cookie": {"kibotos_exposure=" + token}}, ""); resp.StatusCode != http.StatusOK || body != "GET /escaped? " {
		t.Errorf("an escaped slash after the ID: %d %q", resp.StatusCode, body)
	}

	// By host name on a host with an exposure domain, over HTTP/2 too;
	// there path URLs, which would share the listener's origin, are not
	// served, nor unknown names.
	named := newGatewayEnv(t)
	named.agent.cfg.ExposureDomain = "apps.example.test"
	named.set(exposed(assignment("ws_a", 2, key(1)), tokenX), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	namedSrv := testutil.H2CServer(t, named.agent.Exposures())
	for path, host := range map[string]string{"/x/exp_t/page": "", "/": "9-ws-a.apps.example.test"} {
		req, _ := http.NewRequest("GET", namedSrv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if host != "" {
			req.Host = host
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "<h1>") {
			t.Errorf("%s%s under a domain: %d %q, want a 404 page", host, path, resp.StatusCode, b)
		}
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: &http.Transport{Protocols: &protocols}}
	req, _ := http.NewRequest("GET", namedSrv.URL+"/h2", nil)
	req.Host = exposureabi.HostLabel(app.port, "ws_a") + ".apps.example.test:80"
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := h2.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK || string(b) != "GET /h2? " {
		t.Errorf("HTTP/2 by host name: %s %d %q", resp.Proto, resp.StatusCode, b)
	}

	// PUBLIC needs no token; nothing listens on its port: a 502 page.
	if resp, body := do("GET", "/x/exp_p/", nil, ""); resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "port 1 of workspace ws_a") {
		t.Errorf("closed port: %d %q", resp.StatusCode, body)
	}

	// Revocation: a request waiting for its answer, or still sending its
	// body, is answered 404 (never an empty 200 that reads as taken), and
	// a response in flight is cut; new requests are 404.
	inFlight := func(method, path string, body io.Reader) chan *http.Response {
		answered := make(chan *http.Response, 1)
		go func() {
			req, _ := http.NewRequest(method, srv.URL+path, body)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("%s %s: %v", method, path, err)
				answered <- nil
				return
			}
			resp.Body.Close()
			answered <- resp
		}()
		return answered
	}
	upload, keepSending := io.Pipe()
	go func() {
		for {
			if _, err := keepSending.Write([]byte("more")); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	defer keepSending.Close()
	before := len(app.requests())
	waiting, sending := inFlight("GET", "/x/exp_t/stall", nil), inFlight("POST", "/x/exp_t/upload", upload)
	for len(app.requests()) < before+2 { // both have reached the guest
		time.Sleep(10 * time.Millisecond)
	}
	e.set(exposed(assignment("ws_a", 2, key(1)), publicX), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	for what, answered := range map[string]chan *http.Response{"waiting for its answer": waiting, "sending its body": sending} {
		select {
		case resp := <-answered:
			if resp != nil && resp.StatusCode != http.StatusNotFound {
				t.Errorf("a request %s when its exposure was revoked: %d, want 404", what, resp.StatusCode)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("a request %s when its exposure was revoked got no answer", what)
		}
	}
	e.set(exposed(assignment("ws_a", 2, key(1)), tokenX, publicX), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	req, _ = http.NewRequest("GET", srv.URL+"/x/exp_t/stream", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %v %v", resp, err)
	}
	e.set(exposed(assignment("ws_a", 2, key(1)), publicX), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, resp.Body); done <- err }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a revoked exposure's response still runs")
	}
	resp.Body.Close()
	if resp, _ := do("GET", "/x/exp_t/page", http.Header{"Authorization": {"Bearer " + token}}, ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("revoked: %d", resp.StatusCode)
	}
}

// TestExposureProxyHTTPS checks what an https public URL changes: the
// exposure cookie is Secure and the guest sees X-Forwarded-Proto https.
func TestExposureProxyHTTPS(t *testing.T) {
	e := newGatewayEnv(t)
	e.agent.cfg.DataPlaneEndpoint = "https://kibotos.example.test"
	app := newGuestApp(t)
	token, sum := exposureabi.NewToken("exp_t")
	e.set(exposed(assignment("ws_a", 2, key(1)), &hostv1.ExposureAssignment{ExposureId: "exp_t", Port: app.port,
		Auth: ctrlv1.ExposureAuth_EXPOSURE_AUTH_TOKEN, TokenSha256: sum}), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	srv := testutil.H2CServer(t, e.agent.Exposures())
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(srv.URL + "/x/exp_t/?kibotos_token=" + token)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if c := resp.Cookies(); resp.StatusCode != http.StatusSeeOther || len(c) != 1 || !c[0].Secure {
		t.Errorf("query token under https: %d, cookies %v", resp.StatusCode, c)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/x/exp_t/", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Forwarded-Proto", "gopher")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if seen := app.requests(); resp.StatusCode != http.StatusOK || len(seen) != 1 || seen[0].Header.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("under https: %d, the guest saw %v", resp.StatusCode, seen)
	}
}

func TestServesExposure(t *testing.T) {
	a := &Agent{cfg: Config{ExposureDomain: "apps.example.test"}}
	for target, want := range map[string]bool{
		"http://127.0.0.1:8870/x/exp_a/":                                        true,
		"http://127.0.0.1:8870/kibotos.ctrl.v1.WorkspaceService/X":              false,
		"http://127.0.0.1:8870/kibotos.data.v1.FileService/X":                   false,
		"http://8080-ws-a.apps.example.test:8870/kibotos.data.v1.FileService/X": true,
		"http://8080-WS-A.Apps.Example.Test./":                                  true,
		"http://api.apps.example.test/":                                         false,
		"http://8080-ws-a.other.example.test/":                                  false,
		"http://x.8080-ws-a.apps.example.test/":                                 false,
	} {
		if got := a.ServesExposure(httptest.NewRequest("GET", target, nil)); got != want {
			t.Errorf("ServesExposure(%s) = %v", target, got)
		}
	}
	if (&Agent{}).ServesExposure(httptest.NewRequest("GET", "http://8080-ws-a.apps.example.test/", nil)) {
		t.Error("a host without an exposure domain routes by host name")
	}
}

// TestExposureBounds: what a guest's server answers and what callers hold
// is bounded on the host. A header past maxGuestHeaderBytes is a 502 page,
// not read whole; requests beyond an exposure's bound, or the host's, are
// a 503 page with Retry-After while the others are held, and are served
// again once those end.
func TestExposureBounds(t *testing.T) {
	e := newGatewayEnv(t)
	release, arrived := make(chan struct{}), make(chan struct{}, 8)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Header().Set("X-Big", strings.Repeat("a", 4*maxGuestHeaderBytes))
			return
		}
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "late")
	}))
	t.Cleanup(app.Close)
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll) // before the app closes, which waits for its handlers
	port := uint32(app.Listener.Addr().(*net.TCPAddr).Port)
	e.set(exposed(assignment("ws_a", 2, key(1)),
		&hostv1.ExposureAssignment{ExposureId: "exp_a", Port: port, Auth: ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC},
		&hostv1.ExposureAssignment{ExposureId: "exp_b", Port: port, Auth: ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC}),
		hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	proxy := e.agent.Exposures()
	proxy.(*exposureProxy).maxPerExposure, proxy.(*exposureProxy).maxAll = 2, 3
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: 10 * time.Second} // a request let through is held
	get := func(path string) (*http.Response, string) {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Error(err)
			return nil, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	if resp, body := get("/x/exp_a/big"); resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Big") != "" || !strings.Contains(body, "<h1>") {
		t.Errorf("a guest's endless header: %d %q", resp.StatusCode, body)
	}

	answered := make(chan int, 3)
	hold := func(path string) {
		go func() {
			resp, body := get(path)
			if resp == nil || resp.StatusCode != http.StatusOK || body != "late" {
				t.Errorf("a held request: %v %q", resp, body)
			}
			answered <- 1
		}()
		<-arrived
	}
	refused := func(path, why string) {
		t.Helper()
		resp, body := get(path)
		if resp == nil {
			t.Fatalf("%s was let through", why)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, "<h1>") {
			t.Errorf("%s: %d %q, want a 503 page with Retry-After", why, resp.StatusCode, body)
		}
	}
	hold("/x/exp_a/1")
	hold("/x/exp_a/2")
	refused("/x/exp_a/3", "a third request through an exposure of two")
	hold("/x/exp_b/1")
	refused("/x/exp_b/2", "a fourth request through a host of three")
	releaseAll()
	for range 3 {
		<-answered
	}
	if resp, body := get("/x/exp_a/after"); resp.StatusCode != http.StatusOK || body != "late" {
		t.Errorf("once the held requests ended: %d %q", resp.StatusCode, body)
	}
}
