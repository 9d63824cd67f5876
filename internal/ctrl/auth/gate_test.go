package auth

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/callshare"
	"github.com/kibotos/kibotos/internal/testutil"
)

// gateServer serves a stand-in Connect handler behind the Gate: it reads
// the request whole, then waits for hold (when set) before answering. The
// check authenticates "Bearer <caller>" for any caller but "bad".
func gateServer(t *testing.T, shares *callshare.Shares, hold <-chan struct{}, entered chan<- string) *httptest.Server {
	t.Helper()
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if entered != nil {
			entered <- r.Header.Get("Authorization")
		}
		if hold != nil {
			<-hold
		}
		w.Write([]byte("{}"))
	})
	check := func(_ context.Context, _, header string) (string, error) {
		caller, ok := strings.CutPrefix(header, "Bearer ")
		if !ok || caller == "bad" {
			return "", connect.NewError(connect.CodeUnauthenticated, errors.New("bad token"))
		}
		return caller, nil
	}
	srv := httptest.NewServer(Gate(next, check, shares, func(_ *http.Request, _ time.Time, err error) error { return err }))
	t.Cleanup(srv.Close)
	return srv
}

// sendHead opens a connection to srv and sends a Connect request's head
// (extra header lines included) and no body.
func sendHead(t *testing.T, srv *httptest.Server, extra string) net.Conn {
	t.Helper()
	return testutil.SendHead(t, srv.Listener.Addr().String(),
		"POST /svc.v1.S/M HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"+extra+"\r\n")
}

// closedWithin reads conn until the server closes it, failing t when
// that takes longer than d; it returns the status line of an answer.
func closedWithin(t *testing.T, conn net.Conn, d time.Duration) string {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(d))
	r := bufio.NewReader(conn)
	status, _ := r.ReadString('\n')
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatalf("the server still holds the connection after %v (answer %q): %v", d, status, err)
	}
	return strings.TrimSpace(status)
}

// A caller with no valid token cannot hold a connection by sending its
// body slowly, or never: a small request's body must come within
// refusedBodyTimeout, and a large or stream request is refused and the
// connection closed without waiting for its body.
func TestGateHoldsNoConnectionForABadToken(t *testing.T) {
	defer func(d time.Duration) { refusedBodyTimeout = d }(refusedBodyTimeout)
	refusedBodyTimeout = 200 * time.Millisecond
	srv := gateServer(t, nil, nil, nil)

	for _, c := range []struct{ name, header string }{
		{"small, no token", "Content-Length: 60000\r\n"},
		{"small, a bad token", "Authorization: Bearer bad\r\nContent-Length: 60000\r\n"},
	} {
		conn := sendHead(t, srv, c.header)
		closedWithin(t, conn, 5*time.Second)
		t.Logf("%s: cut", c.name)
	}
	for _, c := range []struct{ name, header string }{
		{"large", "Content-Length: 6000000\r\n"},
		{"a stream", "Authorization: Bearer bad\r\nTransfer-Encoding: chunked\r\n"},
	} {
		conn := sendHead(t, srv, c.header)
		if status := closedWithin(t, conn, 2*time.Second); !strings.Contains(status, "401") {
			t.Errorf("%s: answered %q, want 401", c.name, status)
		}
	}

	// A valid token's small body is not hurried.
	conn := sendHead(t, srv, "Authorization: Bearer a\r\nContent-Length: 2\r\n")
	time.Sleep(3 * refusedBodyTimeout)
	io.WriteString(conn, "{}")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if status, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.Contains(status, "200") {
		t.Errorf("a valid token's body sent late: %q, %v", status, err)
	}
}

// One caller's calls in flight are bounded, and the bound is its own:
// another caller's calls go on, and an ended call frees its place.
func TestGateBoundsACallersCallsInFlight(t *testing.T) {
	hold := make(chan struct{})
	entered := make(chan string, 8)
	srv := gateServer(t, callshare.New(2), hold, entered)
	call := func(caller string) (int, string) {
		// A call that is not refused at once waits for hold, which is
		// closed only once the calls that should pass are in.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/svc.v1.S/M", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+caller)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { call("a") })
		<-entered
	}
	status, body := call("a")
	if status != http.StatusTooManyRequests || !strings.Contains(body, "resource_exhausted") || !strings.Contains(body, "2 calls of this token's project") {
		t.Errorf("a third call of a: %d %s, want resource_exhausted", status, body)
	}
	wg.Go(func() { call("b") })
	if got := <-entered; got != "Bearer b" {
		t.Errorf("entered %q, want b's call", got)
	}
	close(hold)
	wg.Wait()
	if status, body := call("a"); status != http.StatusOK {
		t.Errorf("a's call once its others ended: %d %s", status, body)
	}
	<-entered
}
