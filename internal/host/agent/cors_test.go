package agent

import (
	"net/http"
	"strings"
	"testing"
	"time"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestGatewayCORS calls the data-plane gateway as a browser does from a
// page of another origin: a preflight and then the call, which carry the
// CORS headers for the allowed origin only.
func TestGatewayCORS(t *testing.T) {
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	tok := sign(k, "ses_1", "ws_a", 2, time.Hour)
	const console = "https://console.example.com"
	gw := testutil.H2CServer(t, AllowOrigins(e.agent.Gateway(), []string{console}))
	path := gw.URL + "/kibotos.data.v1.FileService/InspectFile"

	preflight := func(origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodOptions, path, nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization,connect-protocol-version,content-type")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	ok := preflight(console)
	if ok.StatusCode != http.StatusNoContent || ok.Header.Get("Access-Control-Allow-Origin") != console ||
		!strings.Contains(strings.ToLower(ok.Header.Get("Access-Control-Allow-Headers")), "authorization") ||
		!strings.Contains(ok.Header.Get("Access-Control-Allow-Methods"), "POST") {
		t.Errorf("the console's preflight: %d %v", ok.StatusCode, ok.Header)
	}
	// A page writes a file on the file bytes path with PUT.
	put, _ := http.NewRequest(http.MethodOptions, gw.URL+guestabi.FileBytesPath+"?path=/tmp/x", nil)
	put.Header.Set("Origin", console)
	put.Header.Set("Access-Control-Request-Method", "PUT")
	put.Header.Set("Access-Control-Request-Headers", "authorization,content-type")
	if resp, _ := testutil.Do(t, http.DefaultClient, put); resp.StatusCode != http.StatusNoContent ||
		resp.Header.Get("Access-Control-Allow-Origin") != console || !strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "PUT") {
		t.Errorf("the console's preflight of a PUT of %s: %d %v", guestabi.FileBytesPath, resp.StatusCode, resp.Header)
	}
	if other := preflight("https://elsewhere.example.com"); other.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("another origin's preflight is allowed: %v", other.Header)
	}

	call := func(origin, token string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, path, strings.NewReader(`{"path":"/etc/hostname","user":"root"}`))
		req.Header.Set("Origin", origin)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := call(console, tok); r.StatusCode != http.StatusOK || r.Header.Get("Access-Control-Allow-Origin") != console {
		t.Errorf("the console's call: %d %v", r.StatusCode, r.Header)
	}
	// A refusal is readable too: the page shows the gateway's error.
	if r := call(console, "bad"); r.StatusCode != http.StatusUnauthorized || r.Header.Get("Access-Control-Allow-Origin") != console {
		t.Errorf("the console's refused call: %d %v", r.StatusCode, r.Header)
	}
	if r := call("https://elsewhere.example.com", tok); r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("another origin's call is readable: %v", r.Header)
	}
}
