package agent

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/propagation"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/admission"
	"github.com/kibotos/kibotos/internal/callshare"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/sdk/bearer"
	"github.com/kibotos/kibotos/sdk/sessiontoken"
)

// This file is the data-plane gateway: it checks session tokens against
// the assignments ctrl sent and streams each call to the guest agent of the
// workspace's running execution.

// DataPlanePrefix is the path prefix of every kibotos.data.v1 call, the
// pattern to mount Gateway at.
const DataPlanePrefix = "/kibotos.data.v1."

// guestDialTimeout bounds connecting to a guest's data socket.
const guestDialTimeout = 5 * time.Second

// Gateway returns the host's data-plane gateway, an http.Handler for
// every path under DataPlanePrefix. A call must carry Authorization:
// Bearer <session token>; the gateway verifies the token against the
// assignment of the execution that serves the token's workspace and
// generation (no call to ctrl), then proxies the call, streaming both ways
// and without the Authorization header, to that execution's guest agent.
// MetricsService it answers itself from the host's counters of the
// execution (see metricsService).
//
// A refused call is a Connect (or gRPC, gRPC-Web) error with an
// ErrorDetail of stage AUTHORIZING_DATA_PLANE: unauthenticated with reason
// SESSION_EXPIRED, SESSION_REVOKED, or UNAUTHENTICATED for everything else
// (no or a malformed token, a MAC that does not verify, a workspace or
// generation this host does not run, a stopped or stopping execution), so
// a caller never learns whether a workspace exists; unavailable with
// reason UNAVAILABLE when the execution should run but does not (yet), or
// its guest agent does not answer.
//
// Calls reach the guests over the agent's connections to them
// (guestHTTPClient); the file bytes path (guestabi.FileBytesPath), which
// carries a file's bytes as a plain HTTP body, over HTTP/1.1 connections
// of its own (newFileBytesTransport).
func (a *Agent) Gateway() http.Handler {
	g := &gateway{agent: a, errors: connect.NewErrorWriter(), now: time.Now}
	if a.cfg.CallsPerProject > 0 {
		g.calls = callshare.New(a.cfg.CallsPerProject)
	}
	_, g.metrics = datav1connect.NewMetricsServiceHandler(&metricsService{agent: a, now: time.Now})
	transport := a.guestHTTPClient().Transport
	proxy := func(buffers httputil.BufferPool) *httputil.ReverseProxy {
		return &httputil.ReverseProxy{
			Rewrite:       rewrite,
			Transport:     transport,
			FlushInterval: -1, // stream every write at once
			BufferPool:    buffers,
			ErrorHandler:  g.proxyError,
			ModifyResponse: func(res *http.Response) error {
				keepDataPlaneHeaders(res.Header)
				keepDataPlaneHeaders(res.Trailer)
				endsStreamCleanly(res)
				return endRequestWithResponse(res)
			},
		}
	}
	g.proxy = proxy(callBuffers)
	g.readFileProxy = proxy(readFileBuffers)
	g.fileBytesProxy = proxy(callBuffers) // its answers are small: the bytes go up (bulkBody)
	g.fileBytesProxy.Transport = a.newFileBytesTransport()
	g.fileBytesProxy.Rewrite = rewriteFileBytes
	return g
}

// readFileBufferSize is the size of the buffer the proxy copies a
// ReadFile response through: a file message (1 MiB). Each read of the
// buffer is one write and flush to the caller, so with the default 32 KiB
// a chunk of a file crossed the gateway as 32 HTTP/2 frames, writes and
// hand-offs between goroutines. Other calls, streams that may live long
// and carry little, keep the default and pin less memory each.
const readFileBufferSize = 1 << 20

var (
	// readFileBuffers are the ReadFile proxy's buffers.
	readFileBuffers = &bufferPool{size: readFileBufferSize}
	// callBuffers are the other proxies' buffers, of httputil's default
	// size.
	callBuffers = &bufferPool{size: 32 << 10}
)

// bufferPool is an httputil.BufferPool that recycles buffers of one size
// between calls. Without one the proxy makes (and zeroes) a buffer for
// every call it carries: for a small call, half of the bytes the gateway
// allocated (BenchmarkGatewayInspectFile).
type bufferPool struct {
	size int
	pool sync.Pool // of *[]byte
}

func (p *bufferPool) Get() []byte {
	if b, ok := p.pool.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, p.size)
}

func (p *bufferPool) Put(b []byte) { p.pool.Put(&b) }

// maxGuestHeaderBytes bounds the header of every answer the host reads
// from a guest (its agent's, or a server's behind an exposure): nothing
// in a guest is trusted, and a header without end was held in the host's
// memory whole.
const maxGuestHeaderBytes = 64 << 10

// guestTransport returns a transport that speaks cleartext HTTP/2 to the
// guest agents' data sockets: a request's URL host is the execution ID.
func (a *Agent) guestTransport() *http.Transport {
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	return &http.Transport{
		Protocols:   &protocols,
		HTTP2:       guestabi.DataSocketHTTP2(),
		DialContext: a.dialGuestH2,
		// Calls wait for one of the connections a guest may have rather
		// than fail at the dial's bound (a burst of calls to a guest with
		// none open dials once per call).
		MaxConnsPerHost:        maxGuestConnections,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: maxGuestHeaderBytes,
	}
}

// newFileBytesTransport returns the transport of the file bytes path's
// uploads: HTTP/1.1 to the guests' data sockets, a connection per transfer
// in flight. A body crosses it as reads and writes of a 1 MiB buffer
// (bulkBody), where HTTP/2 would copy it in and out of stream buffers and
// frames on both sides.
func (a *Agent) newFileBytesTransport() *http.Transport {
	return &http.Transport{
		DialContext:            a.dialGuestData,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		DisableCompression:     true,
		WriteBufferSize:        64 << 10,
		ReadBufferSize:         64 << 10,
		MaxResponseHeaderBytes: maxGuestHeaderBytes,
	}
}

// dialGuestData connects to the data socket of the guest whose execution
// ID is addr's host.
func (a *Agent) dialGuestData(ctx context.Context, _, addr string) (net.Conn, error) {
	id, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, guestDialTimeout)
	defer cancel()
	return a.cfg.Driver.DialGuest(ctx, id, guestabi.DataSocket)
}

type gateway struct {
	agent *Agent
	proxy *httputil.ReverseProxy
	// readFileProxy is proxy with buffers the size of a file message.
	readFileProxy *httputil.ReverseProxy
	// fileBytesProxy carries the file bytes path but its GETs (getFileBytes),
	// over HTTP/1.1.
	fileBytesProxy *httputil.ReverseProxy
	// metrics serves MetricsService on the host.
	metrics http.Handler
	errors  *connect.ErrorWriter
	now     func() time.Time
	// calls bounds the calls in flight of each project; nil bounds none.
	calls *callshare.Shares
}

// executionKey carries the execution a verified call goes to.
type executionKey struct{}

// guestKey carries the host name of the guest connection the call takes
// (guestHost).
type guestKey struct{}

// callerBodyKey carries the caller's request body.
type callerBodyKey struct{}

// endRequestWithResponse closes the caller's request body once the
// guest's response has ended. A guest that ends a stream early (an error
// while the caller still streams its request, as a ConnectService to a
// closed port) reads no more of it; but the proxy waits, before it sends
// the caller the end of the response, for the request body it forwards
// to end, which a caller waiting for that response never does.
func endRequestWithResponse(res *http.Response) error {
	if body, ok := res.Request.Context().Value(callerBodyKey{}).(io.Closer); ok {
		res.Body = &endsRequest{ReadCloser: res.Body, request: body}
	}
	return nil
}

// endsRequest is a response body that closes the request body at its end.
type endsRequest struct {
	io.ReadCloser
	request io.Closer
}

func (b *endsRequest) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.request.Close()
	}
	return n, err
}

// callerBodyCloser returns a func that closes r's body at once, ending
// a read of it in flight with an error, or nil when r has no body or its
// Close would wait. Over HTTP/2 Close only breaks the body's pipe. Over
// HTTP/1.1 it waits for a read in flight and then reads the rest of the
// body (which is why httputil.ReverseProxy never closes it); but nothing
// streams both ways over HTTP/1.1 (Connect's bidirectional streams need
// HTTP/2), so there the caller's body has ended, or the guest's answer
// has not begun and the transport still watches the call's context.
func callerBodyCloser(r *http.Request) func() {
	if r.ProtoMajor < 2 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	body := r.Body
	return func() { body.Close() }
}

// closesCaller is the outbound request body of a call whose caller's body
// closes at once (callerBodyCloser): the transport's Close of it closes
// the caller's body. The proxy gives the transport a body whose Close does
// nothing, and the HTTP/2 transport, which closes it when the call fails
// (the guest's connection lost: a forced stop), waits for its read of the
// body to return before it ends the guest's answer: while the caller sent
// nothing, for ever.
type closesCaller struct {
	io.ReadCloser
	closeCaller func()
}

func (b *closesCaller) Close() error {
	b.closeCaller()
	return b.ReadCloser.Close()
}

// rewrite addresses the outbound request to the execution with only the
// headers of the data plane (keepDataPlaneHeaders): not the session token
// (the guest trusts the gateway, and the token is nobody else's business),
// nor the caller's cookies. The trace context the guest gets is the
// gateway's span of the call, when the gateway is traced
// (tracing.Provider.Handler), and none of the caller's.
func rewrite(pr *httputil.ProxyRequest) {
	guest, _ := pr.In.Context().Value(guestKey{}).(string)
	pr.SetURL(&url.URL{Scheme: "http", Host: guest})
	if closeCaller := callerBodyCloser(pr.In); closeCaller != nil && pr.Out.Body != nil {
		pr.Out.Body = &closesCaller{ReadCloser: pr.Out.Body, closeCaller: closeCaller}
	}
	keepDataPlaneHeaders(pr.Out.Header)
	propagation.TraceContext{}.Inject(pr.Out.Context(), propagation.HeaderCarrier(pr.Out.Header))
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, DataPlanePrefix) {
		http.NotFound(w, r)
		return
	}
	admitted, err := g.authorize(r)
	if err != nil {
		g.reject(w, r, err)
		return
	}
	id, project := admitted.execution, admitted.project
	// A control plane older than project_id names none: each execution
	// is then bounded alone.
	release, ok := g.calls.Take(cmp.Or(project, id))
	if !ok {
		g.reject(w, r, refuse(connect.CodeResourceExhausted, ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED, fmt.Sprintf(
			"%d data-plane calls of this workspace's project are in flight, the most one project may have at once; end some (a process's output, a watch, an upload or a download) before starting another",
			g.calls.Max())))
		return
	}
	defer release()
	admission.Admit(w)
	// A call lives no longer than what admitted it: a stream is cut once
	// its session is revoked or the data plane rotated, and ends with that
	// refusal. Its token's expiry does not cut it (a command may run for
	// longer than any session lives), nor does a stop of the workspace:
	// the guest ends its streams as their processes end, with their exits
	// (a forced stop breaks them).
	cut := new(atomic.Pointer[connect.Error])
	ctx, cancel := whileValid(r.Context(), reauthorizeEvery, func() bool {
		_, err := g.authorize(r)
		if err == nil || errors.Is(err, errNotRunning) || errors.Is(err, sessiontoken.ErrExpired) {
			return true
		}
		var refusal *connect.Error
		if errors.As(g.whyCut(r, admitted, err), &refusal) {
			cut.Store(refusal)
		}
		return false
	})
	defer cancel()
	// The proxy's transport notices the cut only between two reads of the
	// caller's body: a stream whose caller sends nothing (a download
	// through a port, a log tail) ran on after its session was revoked.
	// Closing the caller's body ends the read, and the transport then ends
	// the call and its answer, with the refusal (endsStreamCleanly). A
	// guest gone away is the same wait (closesCaller).
	if closeCaller := callerBodyCloser(r); closeCaller != nil {
		defer context.AfterFunc(ctx, closeCaller)()
	}
	call := context.WithValue(ctx, executionKey{}, id)
	call = context.WithValue(call, cutKey{}, cut)
	call = context.WithValue(call, guestKey{}, g.agent.guestHost(id))
	call = context.WithValue(call, callerBodyKey{}, r.Body)
	var next http.Handler = g.proxy
	switch {
	case strings.HasPrefix(r.URL.Path, "/"+datav1connect.MetricsServiceName+"/"):
		next = g.metrics
	case r.URL.Path == datav1connect.FileServiceReadFileProcedure:
		next = g.readFileProxy
	case r.URL.Path == guestabi.FileBytesPath && r.Method == http.MethodGet:
		next = http.HandlerFunc(g.getFileBytes)
	case r.URL.Path == guestabi.FileBytesPath:
		next = g.fileBytesProxy
	}
	next.ServeHTTP(w, r.WithContext(call))
}

// whileValid returns a context that ends with parent or as soon as valid,
// checked every period, reports false: a request in flight lives no longer
// than what admitted it.
func whileValid(parent context.Context, every time.Duration, valid func() bool) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if !valid() {
					cancel()
					return
				}
			}
		}
	}()
	return ctx, cancel
}

// cutKey keys the refusal that cut a call in flight (whileValid), which
// its stream ends with (endsStreamCleanly).
type cutKey struct{}

// reject answers a call the gateway does not admit, reading nothing more
// of its request (admission.Refuse).
func (g *gateway) reject(w http.ResponseWriter, r *http.Request, err error) {
	admission.Refuse(w, r)
	g.errors.Write(w, r, err)
}

// reauthorizeEvery is how often a running call's session is checked again.
const reauthorizeEvery = 500 * time.Millisecond

// grant is what a verified call may reach.
type grant struct {
	execution, project string
	// key is the data-plane key the call's token verified with.
	key []byte
}

// authorize verifies the call's session token and returns the execution
// it may reach.
func (g *gateway) authorize(r *http.Request) (grant, error) {
	token, ok := bearer.Parse(r.Header.Get("Authorization"))
	if !ok {
		return grant{}, refuse(connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED,
			"a session token is required: send Authorization: Bearer <token> with a token from SessionService.IssueSession")
	}
	tok, err := sessiontoken.Parse(token)
	if err != nil {
		return grant{}, invalidToken()
	}
	if why := g.agent.outOfService(); why != "" {
		return grant{}, refuse(connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE,
			"this host is out of service: "+why)
	}
	id, as, running := g.agent.dataPlaneTarget(tok.WorkspaceID, tok.Generation)
	if as == nil {
		return grant{}, invalidToken()
	}
	key := as.GetDataPlane().GetKey()
	err = tok.Verify(sessiontoken.Authority{WorkspaceID: as.WorkspaceId, Generation: as.Generation,
		Key: key, Revoked: as.GetDataPlane().GetRevokedSessionIds()}, g.now())
	switch {
	case errors.Is(err, sessiontoken.ErrExpired):
		return grant{}, refuseWith(connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED,
			fmt.Errorf("session %s expired at %s; issue a new session (%w)", tok.SessionID, tok.ExpiresAt.Format(time.RFC3339), sessiontoken.ErrExpired))
	case errors.Is(err, sessiontoken.ErrRevoked):
		return grant{}, refuse(connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED,
			fmt.Sprintf("session %s was revoked", tok.SessionID))
	case err != nil:
		return grant{}, invalidToken()
	case !running:
		return grant{}, refuseWith(connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE,
			fmt.Errorf("workspace %s is %w; retry once it runs", tok.WorkspaceID, errNotRunning))
	}
	return grant{execution: id, project: as.GetDataPlane().GetProjectId(), key: key}, nil
}

// whyCut is the refusal that cuts a call admitted with grant a, which
// its check again (authorize) failed with err. A token that no longer
// verifies because the workspace's data plane has another key than the
// one that admitted the call was rotated away (RotateDataPlane), which
// the call is told: it proved its token valid, so this tells it nothing
// a forger could use. New calls with such a token get invalidToken: the
// gateway keeps no earlier key to tell a rotated token from a forged one.
func (g *gateway) whyCut(r *http.Request, a grant, err error) error {
	if !errors.Is(err, errInvalidToken) {
		return err
	}
	token, _ := bearer.Parse(r.Header.Get("Authorization"))
	tok, perr := sessiontoken.Parse(token)
	if perr != nil {
		return err
	}
	_, as, _ := g.agent.dataPlaneTarget(tok.WorkspaceID, tok.Generation)
	if key := as.GetDataPlane().GetKey(); len(key) == 0 || bytes.Equal(key, a.key) {
		return err // the execution has no data plane any more (stopped, deleted)
	}
	return refuse(connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED,
		fmt.Sprintf("the data plane of workspace %s was rotated (RotateDataPlane): no session issued before works; issue a new session", tok.WorkspaceID))
}

// errNotRunning marks the refusal of a call to an execution that does
// not run as ctrl wants: not yet started, or being stopped.
var errNotRunning = errors.New("not running on this host")

// dataPlaneTarget finds the execution that serves a workspace at a
// generation: its ID, its assignment (nil when the host has none), and
// whether it is running as ctrl wants.
func (a *Agent) dataPlaneTarget(workspaceID string, generation uint64) (string, *hostv1.Assignment, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.byWorkspace[workspaceID] {
		as, _ := e.get()
		if as == nil || as.Generation != generation {
			continue
		}
		running := as.Desired == hostv1.DesiredState_DESIRED_STATE_RUNNING && e.reportedRunning(as.Generation)
		return e.id, as, running
	}
	return "", nil, false
}

// guestHost is the host name under which the host's calls reach the
// guest agent of execution id (guestHTTPClient): its runtime ID, so that a
// warm pool entry's connection, opened while it waited (warmConnection),
// serves the workspace it is bound to.
func (a *Agent) guestHost(id string) string { return a.pool.runtimeID(id) }

// warmConnection opens the connection to the guest agent of the runtime
// ID rid that the first data-plane call will take, so that this call does
// not wait for the dial and HTTP/2's greeting (about 1.5 ms here). Over it
// the agent runs once what a StartProcess runs before its process starts
// (the request's decoding, the lookup of root's account, the end of a
// stream), each slower the first time in a fresh agent: it is asked to
// start a program that cannot exist, in the platform's socket directory,
// which it refuses before it makes any process.
func (a *Agent) warmConnection(ctx context.Context, rid string) {
	ctx, cancel := context.WithTimeout(ctx, guestDialTimeout)
	defer cancel()
	procs := datav1connect.NewProcessServiceClient(a.guestHTTPClient(), "http://"+rid)
	stream, err := procs.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{warmUpProgram}}))
	if err != nil {
		return
	}
	for stream.Receive() {
	}
	stream.Close()
}

// warmUpProgram is the program warmConnection asks a guest agent to start.
const warmUpProgram = guestabi.SocketDir + "/warm-up"

// proxyError answers a call whose guest could not be reached.
func (g *gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	// Every call gets an error, never nothing (which the server sends as
	// 200 OK: an upload cut short read as written): the refusal that cut
	// it (whileValid), or unavailable. A caller that left reads none.
	if cut, ok := r.Context().Value(cutKey{}).(*atomic.Pointer[connect.Error]); ok && cut.Load() != nil {
		g.errors.Write(w, r, cut.Load())
		return
	}
	if r.Context().Err() == nil {
		slog.Warn("data plane: guest agent unreachable", "path", r.URL.Path, "err", err)
	}
	g.errors.Write(w, r, refuse(connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE,
		"the workspace's guest agent does not answer; retry shortly"))
}

// errInvalidToken is why invalidToken refuses a call.
var errInvalidToken = errors.New("invalid session token: it is malformed, or not valid for a running execution of its workspace; issue a new session")

func invalidToken() error {
	return refuseWith(connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED, errInvalidToken)
}

// refuse is a gateway error with its ErrorDetail.
func refuse(code connect.Code, reason ctrlv1.FailureReason, msg string) error {
	return refuseWith(code, reason, errors.New(msg))
}

// refuseWith is refuse of an error.
func refuseWith(code connect.Code, reason ctrlv1.FailureReason, cause error) error {
	err := connect.NewError(code, cause)
	if d, derr := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Reason: reason,
		Stage: ctrlv1.FailureStage_FAILURE_STAGE_AUTHORIZING_DATA_PLANE}); derr == nil {
		err.AddDetail(d)
	}
	return err
}
