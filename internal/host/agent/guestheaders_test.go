package agent

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
)

// TestGatewayPassesOnlyDataPlaneHeaders: a caller's cookies, origin and a
// fronting proxy's identity headers do not reach the guest, and a guest's
// cookies, CORS, Clear-Site-Data or Refresh headers (and trailers) do not
// reach the caller, who shares its origin with the web console; nor does
// a 101 answered to a GET of a file's bytes.
func TestGatewayPassesOnlyDataPlaneHeaders(t *testing.T) {
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	tok := sign(k, "ses_1", "ws_a", 2, time.Hour)
	callerHeaders := map[string]string{"Cookie": "sso=SECRET", "X-Auth-Request-Email": "admin@example.com", "Origin": e.url}

	for name, client := range map[string]*http.Client{"http1": http.DefaultClient, "h2c": h2c()} {
		files := datav1connect.NewFileServiceClient(client, e.url, withSession(tok))
		req := connect.NewRequest(&datav1.InspectFileRequest{Path: "/hostile"})
		for k, v := range callerHeaders {
			req.Header().Set(k, v)
		}
		resp, err := files.InspectFile(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for k := range hostileHeaders {
			if v := resp.Header().Get(k); v != "" {
				t.Errorf("%s: the guest's %s %q reached the caller", name, k, v)
			}
			if v := resp.Trailer().Get(k); v != "" {
				t.Errorf("%s: the guest's trailer %s %q reached the caller", name, k, v)
			}
		}
	}
	e.guest.mu.Lock()
	for _, h := range e.guest.headers {
		for k := range h {
			if !dataPlaneHeader(k) && k != "Traceparent" && k != "Tracestate" && k != "Host" { // the execution's, the gateway's
				t.Errorf("the guest saw the caller's %s %q", k, h.Get(k))
			}
		}
	}
	e.guest.mu.Unlock()

	get := func(path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, e.url+guestabi.FileBytesPath+"?path="+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := get("hostile-headers")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET of a file's bytes: %s", resp.Status)
	}
	for k := range hostileHeaders {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("file bytes: the guest's %s %q reached the caller", k, v)
		}
	}
	if resp := get("switch"); resp.StatusCode == http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "" {
		t.Errorf("a guest's 101 to a GET of a file's bytes reached the caller: %s, Upgrade %q", resp.Status, resp.Header.Get("Upgrade"))
	}
}
