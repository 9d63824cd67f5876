package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/testutil"
)

// echoOnce serves one connection of a new loopback listener: it reads
// until the caller's half-close, then answers "got " and what it read and
// closes. It returns the port.
func echoOnce(t *testing.T) uint32 {
	t.Helper()
	return uint32(testutil.ServeOnce(t, func(c net.Conn) {
		in, _ := io.ReadAll(c)
		c.Write(append([]byte("got "), in...))
	}).Port)
}

// wantServiceError checks an error's code and the stage of its
// ErrorDetail.
func wantServiceError(t *testing.T, name string, err error, code connect.Code, stage ctrlv1.FailureStage) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != code {
		t.Errorf("%s: %v, want %v", name, err, code)
		return
	}
	if detail := testutil.ErrorDetail(err); detail == nil || detail.Stage != stage {
		t.Errorf("%s: %v carries no ErrorDetail of stage %v", name, err, stage)
	}
}

func TestDialGuestPort(t *testing.T) {
	e := newGatewayEnv(t)
	e.set(assignment("ws_a", 2, key(1)), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	e.set(assignment("ws_b", 1, key(2)), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	e.set(assignment("ws_c", 4, key(3)), hostv1.ObservedState_OBSERVED_STATE_STARTING)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Half-closes both ways.
	conn, err := e.agent.DialGuestPort(ctx, "ws_a", echoOnce(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(conn); err != nil || string(got) != "got request" {
		t.Errorf("answer %q, %v", got, err)
	}
	conn.Close()

	// An HTTP client dials through it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.URL.Path)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	port := uint32(ln.Addr().(*net.TCPAddr).Port)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return e.agent.DialGuestPort(ctx, "ws_a", port)
	}}}
	defer hc.CloseIdleConnections()
	for range 3 { // the second and third reuse the connection
		resp, err := hc.Get("http://workspace/path")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello from /path" {
			t.Errorf("body %q", body)
		}
	}

	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedPort := uint32(closed.Addr().(*net.TCPAddr).Port)
	closed.Close()
	for _, c := range []struct {
		name      string
		workspace string
		port      uint32
		code      connect.Code
		stage     ctrlv1.FailureStage
	}{
		{"closed port", "ws_a", closedPort, connect.CodeUnavailable, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE},
		{"port 0", "ws_a", 0, connect.CodeInvalidArgument, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE},
		{"port 70000", "ws_a", 70000, connect.CodeInvalidArgument, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE},
		{"unknown workspace", "ws_zzz", port, connect.CodeUnavailable, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE},
		{"not running yet", "ws_c", port, connect.CodeUnavailable, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE},
		{"guest does not answer", "ws_b", port, connect.CodeUnavailable, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE},
	} {
		conn, err := e.agent.DialGuestPort(ctx, c.workspace, c.port)
		if err == nil {
			conn.Close()
		}
		wantServiceError(t, c.name, err, c.code, c.stage)
	}
}

// TestGatewayConnectService: a ConnectService stream passes the gateway
// full-duplex (an echo comes back before the request stream ends) and
// half-closes pass through it; a token for another workspace is refused.
func TestGatewayConnectService(t *testing.T) {
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	e.set(assignment("ws_b", 1, key(2)), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo, until the caller's half-close
		c.(*net.TCPConn).CloseWrite()
	}()
	port := uint32(ln.Addr().(*net.TCPAddr).Port)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	services := datav1connect.NewServiceServiceClient(h2c(), e.url, withSession(sign(k, "ses_1", "ws_a", 2, time.Hour)))
	stream := services.ConnectService(ctx)
	if err := stream.Send(&datav1.ConnectServiceRequest{Port: port}); err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.Receive(); err != nil || !msg.GetConnected() {
		t.Fatalf("first message %v, %v", msg, err)
	}
	for _, word := range []string{"one", "two"} {
		if err := stream.Send(&datav1.ConnectServiceRequest{Data: []byte(word)}); err != nil {
			t.Fatal(err)
		}
		var echo []byte
		for len(echo) < len(word) {
			msg, err := stream.Receive()
			if err != nil {
				t.Fatalf("echo of %q: %v", word, err)
			}
			echo = append(echo, msg.GetData()...)
		}
		if string(echo) != word {
			t.Errorf("echo %q, want %q", echo, word)
		}
	}
	stream.CloseRequest()
	msg, err := stream.Receive()
	if err != nil || !msg.GetEof() {
		t.Errorf("after the half-close: %v, %v; want eof", msg, err)
	}
	if _, err := stream.Receive(); !errors.Is(err, io.EOF) {
		t.Errorf("the stream did not end: %v", err)
	}

	// The guest's error ends the call while the request stream is open.
	ln.Close()
	closed := services.ConnectService(ctx)
	closed.Send(&datav1.ConnectServiceRequest{Port: port})
	_, err = closed.Receive()
	wantServiceError(t, "a closed port", err, connect.CodeUnavailable, ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE)

	other := datav1connect.NewServiceServiceClient(h2c(), e.url, withSession(retarget(sign(key(2), "ses_2", "ws_b", 1, time.Hour), "ws_a")))
	refused := other.ConnectService(ctx)
	refused.Send(&datav1.ConnectServiceRequest{Port: port})
	_, err = refused.Receive()
	wantRefused(t, "another workspace's token", err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED)
}

// TestGatewayCutsIdleStreams: a ConnectService stream whose caller sends
// nothing after connecting (a download through a port, a log tail) while
// the guest's service streams on is cut within a second once its session
// is revoked, with SESSION_REVOKED, or the data plane rotated, with a
// message that says so; and ends unavailable when its guest goes away (a
// forced stop), never running on, or hanging, until the caller sends.
func TestGatewayCutsIdleStreams(t *testing.T) {
	for _, c := range []struct {
		name   string
		end    func(e *gatewayEnv)
		code   connect.Code
		reason ctrlv1.FailureReason
		says   string
	}{
		{"revoked", func(e *gatewayEnv) {
			e.set(assignment("ws_a", 2, key(1), "ses_1"), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
		}, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED, "session ses_1 was revoked"},
		{"rotated", func(e *gatewayEnv) {
			e.set(assignment("ws_a", 2, key(9)), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
		}, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED, "data plane of workspace ws_a was rotated"},
		{"stopped by force", func(e *gatewayEnv) {
			if _, err := e.driver.Stop(context.Background(), "ws_a-2", runtime.StopForce, 0); err != nil {
				t.Fatal(err)
			}
		}, connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE, "went away"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newGatewayEnv(t)
			e.set(assignment("ws_a", 2, key(1)), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
			port := uint32(testutil.ServeOnce(t, func(conn net.Conn) {
				for {
					if _, err := conn.Write([]byte("tick\n")); err != nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}).Port)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			services := datav1connect.NewServiceServiceClient(h2c(), e.url, withSession(sign(key(1), "ses_1", "ws_a", 2, time.Hour)))
			stream := services.ConnectService(ctx)
			defer stream.CloseResponse()
			if err := stream.Send(&datav1.ConnectServiceRequest{Port: port}); err != nil {
				t.Fatal(err)
			}
			if msg, err := stream.Receive(); err != nil || !msg.GetConnected() {
				t.Fatalf("first message %v, %v", msg, err)
			}
			if msg, err := stream.Receive(); err != nil || len(msg.GetData()) == 0 {
				t.Fatalf("the service's first bytes: %v, %v", msg, err)
			}
			c.end(e)
			ended := time.Now()
			// A stream that hangs: the client's transport, too, notices the
			// end of ctx only once its request body ends.
			defer time.AfterFunc(5*time.Second, func() {
				cancel()
				stream.CloseRequest()
			}).Stop()
			var err error
			for err == nil {
				_, err = stream.Receive()
			}
			switch {
			case ctx.Err() != nil:
				t.Fatalf("the stream still ran, or hung, %v after it was %s: %v", time.Since(ended), c.name, err)
			case time.Since(ended) > 2*reauthorizeEvery+time.Second/2:
				t.Errorf("the stream ended %v after it was %s, want within a second", time.Since(ended), c.name)
			}
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != c.code || !strings.Contains(ce.Message(), c.says) {
				t.Errorf("%s: %v, want %v saying %q", c.name, err, c.code, c.says)
			}
			if detail := testutil.ErrorDetail(err); detail.GetReason() != c.reason {
				t.Errorf("%s: detail %v, want reason %v", c.name, detail, c.reason)
			}
		})
	}
}
