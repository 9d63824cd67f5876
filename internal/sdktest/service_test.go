package sdktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// serve starts a server in the workspace and waits until it listens on
// port. It looks in /proc/net rather than connecting, which would take a
// one-shot server's only connection.
func serve(t *testing.T, ws *sdk.Workspace, port uint32, args ...string) {
	t.Helper()
	if _, err := ws.Start(t.Context(), args, sdk.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	listening := fmt.Sprintf(`awk '$4 == "0A" && $2 ~ /:%04X$/ { found = 1 } END { exit !found }' /proc/net/tcp /proc/net/tcp6`, port)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := ws.Exec(t.Context(), []string{"sh", "-c", listening}, sdk.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Success() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v never listened on port %d", args, port)
		}
	}
}

// wantStage checks an error's code and the stage of its ErrorDetail.
func wantStage(t *testing.T, what string, err error, code connect.Code, stage ctrlv1.FailureStage) {
	t.Helper()
	d, _ := sdk.FailureOf(err)
	if connect.CodeOf(err) != code || d.GetStage() != stage {
		t.Errorf("%s: %v (stage %v), want %v with stage %v", what, err, d.GetStage(), code, stage)
	}
}

// TestDialPortHTTP reaches a web server bound to the guest's loopback
// with an http.Client that dials through DialPort.
func TestDialPortHTTP(t *testing.T) {
	ws := newWorkspace(t)
	page := strings.Repeat("kibotos ", 100000)
	if err := ws.MkdirAll(t.Context(), "/tmp/www", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ws.WriteFile(t.Context(), "/tmp/www/index.html", []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	serve(t, ws, 8000, "httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/tmp/www")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return ws.DialPort(ctx, 8000)
	}}}
	defer hc.CloseIdleConnections()
	for range 3 {
		resp, err := hc.Get("http://workspace/index.html")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || string(body) != page {
			t.Fatalf("GET: %s, %d of %d bytes, %v", resp.Status, len(body), len(page), err)
		}
	}
}

// TestDialPortHalfClose: the caller's CloseWrite is the guest service's
// EOF while its answer still comes back, and the service's half-close is
// the caller's EOF while the caller still sends.
func TestDialPortHalfClose(t *testing.T) {
	ws := newWorkspace(t)

	// The service counts what it reads until EOF, then answers.
	serve(t, ws, 9000, "nc", "-l", "-p", "9000", "-e", "sh", "-c", "wc -c; echo tail")
	conn, err := ws.DialPort(t.Context(), 9000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "abcdef"); err != nil {
		t.Fatal(err)
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if answer, err := io.ReadAll(conn); err != nil || string(answer) != "6\ntail\n" {
		t.Errorf("answer %q, %v; want 6 and tail", answer, err)
	}
	conn.Close()

	// busybox nc shuts the socket down for writing at its input's EOF,
	// then copies what it reads to a file until the caller's EOF.
	serve(t, ws, 9001, "sh", "-c", "echo hello | nc -l -p 9001 > /tmp/got")
	if conn, err = ws.DialPort(t.Context(), 9001); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(conn); err != nil || string(got) != "hello\n" {
		t.Fatalf("before the service's EOF: %q, %v", got, err)
	}
	if _, err := io.WriteString(conn, "after eof"); err != nil {
		t.Fatalf("write after the service's EOF: %v", err)
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	waitForFile(t, ws, "/tmp/got", "after eof")
}

// waitForFile waits until the guest file holds want.
func waitForFile(t *testing.T, ws *sdk.Workspace, path, want string) {
	t.Helper()
	var got []byte
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got, _ = ws.ReadFile(t.Context(), path); string(got) == want {
			return
		}
	}
	t.Errorf("%s holds %q, want %q", path, got, want)
}

// TestDialPortRefusals: nothing listening, and ports out of range.
func TestDialPortRefusals(t *testing.T) {
	ws := newWorkspace(t)
	_, err := ws.DialPort(t.Context(), 9999)
	wantStage(t, "a closed port", err, connect.CodeUnavailable, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE)
	for _, port := range []uint32{0, 70000} {
		_, err := ws.DialPort(t.Context(), port)
		wantStage(t, "a port out of range", err, connect.CodeInvalidArgument, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := ws.DialPort(ctx, 9999); !errors.Is(err, context.Canceled) {
		t.Errorf("a canceled dial: %v", err)
	}
}

// TestDialPortEndsWhileIdle: a DialPort connection that only reads (a
// download, a tail) while the guest's service streams on is cut within a
// second once its session is revoked (SESSION_REVOKED) or the data plane
// rotated (unauthenticated, saying so), and ends unavailable once a forced
// stop takes its guest away: it neither runs on nor hangs.
func TestDialPortEndsWhileIdle(t *testing.T) {
	d := uptest.Shared(t)
	token := d.Project(t)
	c := sdk.New(d.URL+"/", token)
	t.Cleanup(c.Close)
	ws, err := c.CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ws, 9003, "nc", "-ll", "-p", "9003", "-e", "sh", "-c", "while echo tick; do sleep 0.1; done")
	sessions := ctrlv1connect.NewSessionServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(token)))

	// dial connects a handle of its own (a session of its own) to the
	// service and reads its first tick.
	dial := func() (*sdk.Workspace, net.Conn) {
		t.Helper()
		h, err := c.Workspace(t.Context(), ws.ID())
		if err != nil {
			t.Fatal(err)
		}
		conn, err := h.DialPort(t.Context(), 9003)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		tick := make([]byte, len("tick\n"))
		if _, err := io.ReadFull(conn, tick); err != nil || string(tick) != "tick\n" {
			t.Fatalf("first tick: %q, %v", tick, err)
		}
		return h, conn
	}
	// ends reads conn until it fails, and wants that within a second and
	// a half of now.
	ends := func(what string, conn net.Conn) error {
		t.Helper()
		from := time.Now()
		conn.SetReadDeadline(from.Add(5 * time.Second))
		_, err := io.Copy(io.Discard, conn)
		switch took := time.Since(from); {
		case errors.Is(err, os.ErrDeadlineExceeded):
			t.Errorf("%s: the connection still runs, or hangs, %v after", what, took)
		case took > 1500*time.Millisecond:
			t.Errorf("%s: the connection ended %v after, want within a second", what, took)
		}
		return err
	}

	h, conn := dial()
	if _, err := sessions.RevokeSession(t.Context(), connect.NewRequest(&ctrlv1.RevokeSessionRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, SessionId: h.CurrentSession().ID})); err != nil {
		t.Fatal(err)
	}
	err = ends("revoked", conn)
	if f, _ := sdk.FailureOf(err); connect.CodeOf(err) != connect.CodeUnauthenticated || f.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED {
		t.Errorf("revoked: %v (%v), want unauthenticated, SESSION_REVOKED", err, f.GetReason())
	}

	_, conn = dial()
	if _, err := sessions.RotateDataPlane(t.Context(), connect.NewRequest(&ctrlv1.RotateDataPlaneRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, WorkspaceId: ws.ID()})); err != nil {
		t.Fatal(err)
	}
	if err := ends("rotated", conn); connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "rotated") {
		t.Errorf("rotated: %v, want unauthenticated saying the data plane was rotated", err)
	}

	_, conn = dial()
	if _, err := c.StopWorkspace(t.Context(), ws.ID(), sdk.StopOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := ends("stopped by force", conn); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("stopped by force: %v, want unavailable", err)
	}
}
