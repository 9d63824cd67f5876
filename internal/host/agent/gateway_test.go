package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/guest/dataplane"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/host/runtime/fake"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk/sessiontoken"
)

// guest is an in-process stand-in for a guest agent's data plane: a tiny
// part of FileService and ProcessService over cleartext HTTP/2.
type guest struct {
	datav1connect.UnimplementedFileServiceHandler
	datav1connect.UnimplementedProcessServiceHandler

	mu      sync.Mutex
	auth    []string      // Authorization headers the guest saw
	trace   []string      // and traceparent headers
	headers []http.Header // and all of them
	// release lets StartProcess go on after its first event.
	release chan struct{}
}

func (g *guest) saw(h http.Header) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.auth = append(g.auth, h.Get("Authorization"))
	g.trace = append(g.trace, h.Get("traceparent"))
	g.headers = append(g.headers, h.Clone())
}

// hostileHeaders are what a hostile guest answers to make the
// deployment's origin (the web console's) keep or forget something.
var hostileHeaders = map[string]string{
	"Set-Cookie":                  "planted=1; Path=/",
	"Clear-Site-Data":             `"storage"`,
	"Access-Control-Allow-Origin": "*",
	"Refresh":                     "0; url=http://evil.test/",
}

// InspectFile of /hostile answers with hostileHeaders.
func (g *guest) InspectFile(_ context.Context, req *connect.Request[datav1.InspectFileRequest]) (*connect.Response[datav1.InspectFileResponse], error) {
	g.saw(req.Header())
	resp := connect.NewResponse(&datav1.InspectFileResponse{File: &datav1.FileInfo{Path: req.Msg.Path, Owner: req.Msg.User}})
	if req.Msg.Path == "/hostile" {
		for k, v := range hostileHeaders {
			resp.Header().Set(k, v)
			resp.Trailer().Set(k, v)
		}
	}
	return resp, nil
}

func (g *guest) WriteFile(_ context.Context, stream *connect.ClientStream[datav1.WriteFileRequest]) (*connect.Response[datav1.WriteFileResponse], error) {
	g.saw(stream.RequestHeader())
	info := &datav1.FileInfo{}
	for stream.Receive() {
		switch p := stream.Msg().Part.(type) {
		case *datav1.WriteFileRequest_Start:
			info.Path = p.Start.Path
		case *datav1.WriteFileRequest_Data:
			info.Size += uint64(len(p.Data))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&datav1.WriteFileResponse{File: info}), nil
}

// ReadFile streams the number of MiB the path names, in messages of 1 MiB
// as the guest agent's.
func (g *guest) ReadFile(_ context.Context, req *connect.Request[datav1.ReadFileRequest], stream *connect.ServerStream[datav1.ReadFileResponse]) error {
	g.saw(req.Header())
	mib, err := strconv.Atoi(req.Msg.Path)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	chunk := make([]byte, 1<<20)
	for range mib {
		if err := stream.Send(&datav1.ReadFileResponse{Data: chunk}); err != nil {
			return err
		}
	}
	return nil
}

func (g *guest) StartProcess(ctx context.Context, req *connect.Request[datav1.StartProcessRequest], stream *connect.ServerStream[datav1.ProcessEvent]) error {
	g.saw(req.Header())
	if err := stream.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Started_{Started: &datav1.ProcessEvent_Started{Pid: 7}}}); err != nil {
		return err
	}
	// The rest comes only once the caller has the first event: the
	// gateway must not hold the stream back.
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Second):
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("caller never saw the first event"))
	}
	for _, a := range req.Msg.Args {
		if err := stream.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte(a)}}); err != nil {
			return err
		}
	}
	return stream.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Exited_{Exited: &datav1.ProcessEvent_Exited{ExitCode: 3}}})
}

// h2c returns an HTTP client that speaks cleartext HTTP/2, which
// streaming Connect calls need.
func h2c() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

type gatewayEnv struct {
	agent  *Agent
	driver *fake.Driver
	guest  *guest
	url    string
}

// newGatewayEnv serves the gateway of an agent of configure's Config.
func newGatewayEnv(t testing.TB, configure ...func(*Config)) *gatewayEnv {
	t.Helper()
	g := &guest{release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle(datav1connect.NewFileServiceHandler(g))
	mux.Handle(datav1connect.NewProcessServiceHandler(g))
	mux.HandleFunc(guestabi.FileBytesPath, g.serveFileBytes)
	// The guest agent's own ServiceService: it dials the test's loopback.
	mux.Handle(datav1connect.NewServiceServiceHandler(dataplane.NewServiceService()))
	drv := fake.New()
	drv.ServeDataPlane(mux)
	// Only ws_a-2 runs; the driver has no guest for the others.
	layer := filepath.Join(t.TempDir(), "layer.img")
	if err := drv.CreateLayer(context.Background(), layer, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := drv.Start(context.Background(), runtime.Spec{ID: "ws_a-2", Layers: []string{"/layers/base"}, LayerImage: layer, GuestAgent: "/bin/kibotos-guest"}); err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: Config{Driver: drv, Network: NetworkConfig{Dir: t.TempDir()}}, execs: map[string]*execution{}}
	for _, c := range configure {
		c(&a.cfg)
	}
	gw := testutil.H2CServer(t, a.Gateway())
	return &gatewayEnv{agent: a, driver: drv, guest: g, url: gw.URL}
}

// set makes the agent hold an execution with this assignment, observed in
// state.
func (e *gatewayEnv) set(as *hostv1.Assignment, state hostv1.ObservedState) {
	e.agent.mu.Lock()
	defer e.agent.mu.Unlock()
	ex, ok := e.agent.execs[as.ExecutionId]
	if !ok {
		ex = &execution{agent: e.agent, id: as.ExecutionId, wake: make(chan struct{}, 1)}
		e.agent.execs[as.ExecutionId] = ex
	}
	e.agent.assign(ex, as)
	ex.mu.Lock()
	ex.last = &hostv1.ExecutionReport{ExecutionId: as.ExecutionId, WorkspaceId: as.WorkspaceId, Generation: as.Generation, State: state}
	ex.mu.Unlock()
}

func assignment(ws string, gen uint64, key []byte, revoked ...string) *hostv1.Assignment {
	return &hostv1.Assignment{ExecutionId: fmt.Sprintf("%s-%d", ws, gen), WorkspaceId: ws, Generation: gen,
		Desired: hostv1.DesiredState_DESIRED_STATE_RUNNING, DataPlane: &hostv1.DataPlane{Key: key, RevokedSessionIds: revoked}}
}

func key(b byte) []byte {
	k := make([]byte, sessiontoken.KeySize)
	for i := range k {
		k[i] = b
	}
	return k
}

func sign(k []byte, session, ws string, gen uint64, ttl time.Duration) string {
	return sessiontoken.Sign(k, sessiontoken.Claims{SessionID: session, WorkspaceID: ws, Generation: gen, ExpiresAt: time.Now().Add(ttl)})
}

// withSession sends a session token with every call.
func withSession(tok string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if tok != "" {
				req.Header().Set("Authorization", "Bearer "+tok)
			}
			return next(ctx, req)
		}
	}), streamingBearer(tok))
}

type streamingBearer string

func (b streamingBearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (b streamingBearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if b != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		}
		return conn
	}
}
func (b streamingBearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (e *gatewayEnv) inspect(client *http.Client, tok string, opts ...connect.ClientOption) (*datav1.FileInfo, error) {
	files := datav1connect.NewFileServiceClient(client, e.url, append(opts, withSession(tok))...)
	resp, err := files.InspectFile(context.Background(), connect.NewRequest(&datav1.InspectFileRequest{Path: "/etc/hostname", User: "root"}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.File, nil
}

// wantRefused checks a refused call's code and ErrorDetail.
func wantRefused(t *testing.T, name string, err error, code connect.Code, reason ctrlv1.FailureReason) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Errorf("%s: %v, want %v", name, err, code)
		return
	}
	detail := testutil.ErrorDetail(err)
	if detail == nil {
		t.Errorf("%s: %v carries no ErrorDetail", name, err)
		return
	}
	if detail.Reason != reason || detail.Stage != ctrlv1.FailureStage_FAILURE_STAGE_AUTHORIZING_DATA_PLANE {
		t.Errorf("%s: detail %v, want reason %v at AUTHORIZING_DATA_PLANE", name, detail, reason)
	}
}

func TestGatewayProxiesVerifiedCalls(t *testing.T) {
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	tok := sign(k, "ses_1", "ws_a", 2, time.Hour)

	// Unary, over HTTP/1.1 (Connect JSON) and HTTP/2 (binary), and gRPC.
	for name, call := range map[string]func() (*datav1.FileInfo, error){
		"http1 json": func() (*datav1.FileInfo, error) { return e.inspect(http.DefaultClient, tok, connect.WithProtoJSON()) },
		"h2c binary": func() (*datav1.FileInfo, error) { return e.inspect(h2c(), tok) },
		"grpc":       func() (*datav1.FileInfo, error) { return e.inspect(h2c(), tok, connect.WithGRPC()) },
	} {
		info, err := call()
		if err != nil || info.GetPath() != "/etc/hostname" || info.GetOwner() != "root" {
			t.Errorf("%s: %v, %v", name, info, err)
		}
	}

	// A server stream arrives event by event.
	procs := datav1connect.NewProcessServiceClient(h2c(), e.url, withSession(tok))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := procs.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"a", "b", "c"}}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStarted().GetPid() != 7 {
		t.Fatalf("first event: %v, %v", stream.Msg(), stream.Err())
	}
	close(e.guest.release)
	var out string
	var exit *datav1.ProcessEvent_Exited
	for stream.Receive() {
		out += string(stream.Msg().GetStdout())
		if x := stream.Msg().GetExited(); x != nil {
			exit = x
		}
	}
	if stream.Err() != nil || out != "abc" || exit.GetExitCode() != 3 {
		t.Errorf("stream: out %q, exit %v, err %v", out, exit, stream.Err())
	}
	stream.Close()

	// A client stream goes through as well.
	files := datav1connect.NewFileServiceClient(h2c(), e.url, withSession(tok))
	up := files.WriteFile(ctx)
	up.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: "/tmp/x"}}})
	for range 3 {
		up.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: make([]byte, 1000)}})
	}
	resp, err := up.CloseAndReceive()
	if err != nil || resp.Msg.File.GetSize() != 3000 || resp.Msg.File.GetPath() != "/tmp/x" {
		t.Errorf("write: %v, %v", resp, err)
	}

	// A file's bytes come through whole, in the proxy with large buffers.
	read, err := files.ReadFile(ctx, connect.NewRequest(&datav1.ReadFileRequest{Path: "3"}))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for read.Receive() {
		n += len(read.Msg().GetData())
	}
	if read.Err() != nil || n != 3<<20 {
		t.Errorf("read: %d bytes, %v", n, read.Err())
	}
	read.Close()

	e.guest.mu.Lock()
	defer e.guest.mu.Unlock()
	if len(e.guest.auth) != 6 {
		t.Errorf("guest saw %d calls, want 6", len(e.guest.auth))
	}
	for _, a := range e.guest.auth {
		if a != "" {
			t.Errorf("the guest saw Authorization %q", a)
		}
	}
}

func TestGatewayRefusesBadSessions(t *testing.T) {
	e := newGatewayEnv(t)
	k, other := key(1), key(2)
	e.set(assignment("ws_a", 2, k, "ses_revoked"), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	e.set(assignment("ws_b", 1, other), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	e.set(assignment("ws_c", 4, key(3)), hostv1.ObservedState_OBSERVED_STATE_STARTING)

	unauth := ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED
	valid := sign(k, "ses_1", "ws_a", 2, time.Hour)
	tampered := []byte(valid)
	tampered[len(tampered)-3] ^= 1
	for _, c := range []struct {
		name   string
		token  string
		code   connect.Code
		reason ctrlv1.FailureReason
	}{
		{"no token", "", connect.CodeUnauthenticated, unauth},
		{"garbage", "garbage", connect.CodeUnauthenticated, unauth},
		{"api token", "tok_00000000000000000000000000.secret", connect.CodeUnauthenticated, unauth},
		{"tampered mac", string(tampered), connect.CodeUnauthenticated, unauth},
		{"wrong key", sign(other, "ses_1", "ws_a", 2, time.Hour), connect.CodeUnauthenticated, unauth},
		{"another workspace's token", retarget(sign(other, "ses_2", "ws_b", 1, time.Hour), "ws_a"), connect.CodeUnauthenticated, unauth},
		{"unknown workspace", sign(k, "ses_1", "ws_zzz", 2, time.Hour), connect.CodeUnauthenticated, unauth},
		{"old generation", sign(k, "ses_1", "ws_a", 1, time.Hour), connect.CodeUnauthenticated, unauth},
		{"expired", sign(k, "ses_1", "ws_a", 2, -time.Second), connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED},
		{"revoked", sign(k, "ses_revoked", "ws_a", 2, time.Hour), connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED},
		{"not running yet", sign(key(3), "ses_1", "ws_c", 4, time.Hour), connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE},
		{"guest does not answer", sign(other, "ses_2", "ws_b", 1, time.Hour), connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE},
	} {
		_, err := e.inspect(h2c(), c.token)
		wantRefused(t, c.name, err, c.code, c.reason)
		// Streams and other protocols are refused the same way.
		procs := datav1connect.NewProcessServiceClient(h2c(), e.url, withSession(c.token), connect.WithGRPC())
		stream, err := procs.StartProcess(context.Background(), connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"x"}}))
		if err == nil {
			for stream.Receive() {
				t.Errorf("%s: stream delivered %v", c.name, stream.Msg())
			}
			err = stream.Err()
		}
		wantRefused(t, c.name+" (grpc stream)", err, c.code, c.reason)
	}
	e.guest.mu.Lock()
	if len(e.guest.auth) != 0 {
		t.Errorf("refused calls reached the guest: %d", len(e.guest.auth))
	}
	e.guest.mu.Unlock()

	// The gateway follows the assignment: a revocation, a rotated key and
	// a new generation take effect on the next call.
	if _, err := e.inspect(h2c(), valid); err != nil {
		t.Fatalf("valid token: %v", err)
	}
	e.set(assignment("ws_a", 2, k, "ses_1"), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	_, err := e.inspect(h2c(), valid)
	wantRefused(t, "revoked later", err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED)
	e.set(assignment("ws_a", 2, key(9)), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	_, err = e.inspect(h2c(), valid)
	wantRefused(t, "rotated", err, connect.CodeUnauthenticated, unauth)
	stopped := assignment("ws_a", 2, nil)
	stopped.Desired, stopped.DataPlane = hostv1.DesiredState_DESIRED_STATE_STOPPED, nil
	e.set(stopped, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
	_, err = e.inspect(h2c(), sign(key(9), "ses_1", "ws_a", 2, time.Hour))
	wantRefused(t, "stopped", err, connect.CodeUnauthenticated, unauth)
}

// retarget rewrites the workspace a token names, keeping its MAC.
func retarget(tok, ws string) string {
	t, err := sessiontoken.Parse(tok)
	if err != nil {
		panic(err)
	}
	rest := tok[len(t.SessionID)+1+len(t.WorkspaceID):]
	return t.SessionID + "." + ws + rest
}

func TestGatewayServesOnlyTheDataPlane(t *testing.T) {
	e := newGatewayEnv(t)
	resp, err := http.Get(e.url + "/kibotos.ctrl.v1.WorkspaceService/GetWorkspace")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("a ctrl path: status %d", resp.StatusCode)
	}
}

// BenchmarkGatewayInspectFile times a small unary call through the
// gateway between in-process ends: the gateway's part of every call that
// carries little, an exec's included.
func BenchmarkGatewayInspectFile(b *testing.B) {
	e := newGatewayEnv(b)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	files := datav1connect.NewFileServiceClient(h2c(), e.url, withSession(sign(k, "ses_1", "ws_a", 2, time.Hour)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := files.InspectFile(context.Background(), connect.NewRequest(&datav1.InspectFileRequest{Path: "/etc/hostname"})); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGatewayReadFile times a ReadFile of 64 MiB through the gateway
// between in-process ends that speak HTTP/2 with 1 MiB frames, as the SDK
// and the guest agent do: the gateway's part of a download.
func BenchmarkGatewayReadFile(b *testing.B) {
	e := newGatewayEnv(b)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &p, HTTP2: &http.HTTP2Config{MaxReadFrameSize: 1 << 20}}}
	files := datav1connect.NewFileServiceClient(client, e.url, withSession(sign(k, "ses_1", "ws_a", 2, time.Hour)))
	const mib = 64
	b.SetBytes(mib << 20)
	for b.Loop() {
		stream, err := files.ReadFile(context.Background(), connect.NewRequest(&datav1.ReadFileRequest{Path: strconv.Itoa(mib)}))
		if err != nil {
			b.Fatal(err)
		}
		var n int
		for stream.Receive() {
			n += len(stream.Msg().Data)
		}
		if err := stream.Err(); err != nil || n != mib<<20 {
			b.Fatalf("read %d bytes: %v", n, err)
		}
		stream.Close()
	}
}

// TestRefusedHostServesNothing: a host whose credentials the control
// plane refuses (its token revoked) serves no data-plane call, even with
// a session that verifies, and serves them again once accepted.
func TestRefusedHostServesNothing(t *testing.T) {
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	tok := sign(k, "ses_1", "ws_a", 2, time.Hour)
	if _, err := e.inspect(h2c(), tok); err != nil {
		t.Fatal(err)
	}
	why := "unauthenticated: revoked"
	e.agent.refusal.Store(&why)
	if _, err := e.inspect(h2c(), tok); connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "out of service") {
		t.Errorf("a call to a refused host: %v, want unavailable", err)
	}
	e.agent.refusal.Store(nil)
	if _, err := e.inspect(h2c(), tok); err != nil {
		t.Errorf("a call once accepted again: %v", err)
	}
}

// TestGatewayBoundsConnectionsToAGuest: a guest that allows one HTTP/2
// stream at a time does not make the host open a connection, and buffer a
// connection's window of answers, per call: it holds at most
// maxGuestConnections to the guest, the calls it cannot carry fail
// unavailable, and those it carries complete.
func TestGatewayBoundsConnectionsToAGuest(t *testing.T) {
	e := newGatewayEnv(t)
	e.driver.LimitDataPlaneStreams(1)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	procs := datav1connect.NewProcessServiceClient(h2c(), e.url, withSession(sign(k, "ses_1", "ws_a", 2, time.Hour)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calls := 2 * maxGuestConnections
	var (
		wg sync.WaitGroup
		// settled has a value for each call that started or ended: the
		// guest holds the started ones until release.
		settled     = make(chan struct{}, calls)
		done, unavl atomic.Int32
	)
	for range calls {
		// One at a time, each held by the guest: the host knows the
		// guest's one stream from the first.
		wg.Go(func() {
			var out string
			var err error
			defer func() {
				switch {
				case connect.CodeOf(err) == connect.CodeUnavailable:
					unavl.Add(1)
				case err == nil && out == "out":
					done.Add(1)
				default:
					t.Errorf("a call: %q, %v", out, err)
				}
			}()
			stream, err := procs.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"out"}}))
			if err != nil {
				settled <- struct{}{}
				return
			}
			defer stream.Close()
			first := true
			for stream.Receive() {
				if first {
					first = false
					settled <- struct{}{}
				}
				out += string(stream.Msg().GetStdout())
			}
			if err = stream.Err(); first {
				settled <- struct{}{}
			}
		})
		<-settled
	}
	close(e.guest.release)
	wg.Wait()
	if n := e.driver.DataPlaneDials(); n > maxGuestConnections {
		t.Errorf("%d calls to a guest of one stream dialed it %d times, want at most %d", calls, n, maxGuestConnections)
	}
	if done.Load() != maxGuestConnections || unavl.Load() != int32(calls-maxGuestConnections) {
		t.Errorf("%d calls completed and %d were unavailable, of %d", done.Load(), unavl.Load(), calls)
	}
}

// TestGatewayCarriesBursts: the bound on a guest's connections leaves an
// honest guest's calls alone: a burst of calls to a guest with no
// connection open (each of which the transport would dial for) waits for
// one of the few the host may hold rather than failing.
func TestGatewayCarriesBursts(t *testing.T) {
	e := newGatewayEnv(t)
	e.driver.SlowDataPlaneDials(100 * time.Millisecond) // the calls of the burst all meet no connection
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	procs := datav1connect.NewProcessServiceClient(h2c(), e.url, withSession(sign(k, "ses_1", "ws_a", 2, time.Hour)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	calls := 4 * maxGuestConnections
	var wg sync.WaitGroup
	settled := make(chan struct{}, calls) // a call started, or failed
	for range calls {
		wg.Go(func() {
			stream, err := procs.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"x"}}))
			if err == nil {
				first := true
				for stream.Receive() {
					if first {
						first = false
						settled <- struct{}{}
					}
				}
				if err = stream.Err(); first {
					settled <- struct{}{}
				}
				stream.Close()
			} else {
				settled <- struct{}{}
			}
			if err != nil {
				t.Errorf("a call of the burst: %v", err)
			}
		})
	}
	// The guest holds each call until all of them are in.
	for range calls {
		<-settled
	}
	close(e.guest.release)
	wg.Wait()
	if n := e.driver.DataPlaneDials(); n > maxGuestConnections {
		t.Errorf("the burst dialed the guest %d times, want at most %d", n, maxGuestConnections)
	}
}

// TestGatewayBoundsAProjectsCallsInFlight: with a bound of 2, a third
// data-plane call of a project whose two calls, to two of its workspaces,
// are in flight is resource_exhausted, while another project's call goes
// on; the project gets its calls back as the two end. A call with no
// valid session holds no connection: its request is not read.
func TestGatewayBoundsAProjectsCallsInFlight(t *testing.T) {
	e := newGatewayEnv(t, func(c *Config) { c.CallsPerProject = 2 })
	project := map[string]string{"ws_a": "prj_a", "ws_b": "prj_a", "ws_c": "prj_c"}
	tokens := map[string]string{}
	for i, ws := range []string{"ws_a", "ws_b", "ws_c"} {
		gen := uint64(1)
		if ws == "ws_a" {
			gen = 2 // started by newGatewayEnv
		} else {
			layer := filepath.Join(t.TempDir(), "layer.img")
			if err := e.driver.CreateLayer(t.Context(), layer, 1<<20); err != nil {
				t.Fatal(err)
			}
			if err := e.driver.Start(t.Context(), runtime.Spec{ID: ws + "-1", Layers: []string{"/layers/base"}, LayerImage: layer, GuestAgent: "/bin/kibotos-guest"}); err != nil {
				t.Fatal(err)
			}
		}
		k := key(byte(i + 1))
		as := assignment(ws, gen, k)
		as.DataPlane.ProjectId = project[ws]
		e.set(as, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
		tokens[ws] = sign(k, "ses_"+ws, ws, gen, time.Hour)
	}

	// A process in each of prj_a's workspaces, held after its first event.
	for _, ws := range []string{"ws_a", "ws_b"} {
		procs := datav1connect.NewProcessServiceClient(h2c(), e.url, withSession(tokens[ws]))
		stream, err := procs.StartProcess(t.Context(), connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"x"}}))
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		if !stream.Receive() {
			t.Fatalf("first event in %s: %v", ws, stream.Err())
		}
	}
	_, err := e.inspect(h2c(), tokens["ws_a"])
	wantRefused(t, "a third call of prj_a", err, connect.CodeResourceExhausted, ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED)
	if _, err := e.inspect(h2c(), tokens["ws_c"]); err != nil {
		t.Errorf("a call of prj_c meanwhile: %v", err)
	}
	close(e.guest.release)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := e.inspect(h2c(), tokens["ws_a"])
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prj_a's call once its processes ended: %v", err)
		}
	}

	// No session: answered at once, the body never read, the connection
	// closed.
	conn := testutil.SendHead(t, strings.TrimPrefix(e.url, "http://"),
		"POST "+datav1connect.FileServiceInspectFileProcedure+" HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer, err := io.ReadAll(conn)
	if err != nil || !strings.HasPrefix(string(answer), "HTTP/1.1 401") {
		t.Errorf("a call with no session whose body never comes: %q, %v; want a 401 and the connection closed", answer, err)
	}
}
