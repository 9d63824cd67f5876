package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
)

// fake is a control plane and a data plane on one server: the sessions it
// issues name the same server as their endpoint. The tests of the SDK run
// on the real deployment (deployment_test.go); this fake stands in only
// where a test needs what the real server does not do on demand: fail a
// start, expire a session at once, issue sessions about to expire. It
// serves no FileBytesPath, as an older data plane, so uploads and
// downloads fall back to FileService's streams.
type fake struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	ctrlv1connect.UnimplementedSessionServiceHandler
	datav1connect.UnimplementedProcessServiceHandler
	datav1connect.UnimplementedFileServiceHandler

	endpoint   string
	watch      []*ctrlv1.Workspace // WatchWorkspace sends these, in order
	sessionTTL time.Duration

	mu         sync.Mutex
	issued     []string                        // tokens, in order
	expired    map[string]bool                 // tokens the data plane rejects as expired
	refused    map[string]ctrlv1.FailureReason // tokens it refuses for another reason
	expireNext bool                            // expire the token of the next data-plane call
	auth       map[string]string               // Authorization of the last call, by procedure
	chunks     [][]byte                        // of the last WriteFile
	startDelay time.Duration                   // StartProcess waits this long before its started event
	signals    []string                        // "pid signal" of each SignalProcess
	hugeList   bool                            // ListProcesses answers a message over maxDataPlaneMessage
	// refuseAfter has WriteFile refuse a session only once that many of
	// the upload's bytes arrived (at least one), as when the refusal is
	// slower than the upload.
	refuseAfter int
}

func newFake(t *testing.T) (*fake, *Client) {
	t.Helper()
	f := &fake{
		auth:       map[string]string{},
		expired:    map[string]bool{},
		refused:    map[string]ctrlv1.FailureReason{},
		sessionTTL: time.Hour,
		watch: []*ctrlv1.Workspace{
			{WorkspaceId: "ws_1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING},
			{WorkspaceId: "ws_1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, Delivery: &ctrlv1.TemplateDeliveryObservation{BytesTotal: 10}},
			{WorkspaceId: "ws_1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, Generation: 1},
		},
	}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(f))
	mux.Handle(ctrlv1connect.NewSessionServiceHandler(f))
	mux.Handle(datav1connect.NewProcessServiceHandler(f))
	mux.Handle(datav1connect.NewFileServiceHandler(f))
	srv := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		f.mu.Lock()
		f.auth[method] = r.Header.Get("Authorization")
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	f.endpoint = srv.URL
	c := New(srv.URL+"/", "api-token")
	t.Cleanup(c.Close)
	return f, c
}

// authorize is the data plane's session check.
func (f *fake) authorize(h http.Header) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	tok := strings.TrimPrefix(h.Get("Authorization"), "Bearer ")
	if f.expireNext {
		f.expireNext = false
		f.expired[tok] = true
	}
	if reason, ok := f.refused[tok]; ok {
		err := connect.NewError(connect.CodeUnauthenticated, errors.New("session refused"))
		d, _ := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Reason: reason, Stage: ctrlv1.FailureStage_FAILURE_STAGE_AUTHORIZING_DATA_PLANE})
		err.AddDetail(d)
		return err
	}
	if f.expired[tok] {
		err := connect.NewError(connect.CodeUnauthenticated, errors.New("session expired"))
		d, _ := connect.NewErrorDetail(&ctrlv1.ErrorDetail{
			Reason: ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED,
			Stage:  ctrlv1.FailureStage_FAILURE_STAGE_AUTHORIZING_DATA_PLANE,
		})
		err.AddDetail(d)
		return err
	}
	return nil
}

func (f *fake) CreateWorkspace(_ context.Context, _ *connect.Request[ctrlv1.CreateWorkspaceRequest]) (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
	return connect.NewResponse(&ctrlv1.CreateWorkspaceResponse{Workspace: f.watch[0]}), nil
}

func (f *fake) GetWorkspace(_ context.Context, r *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	if r.Msg.GetWorkspaceId() != "ws_1" {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such workspace"))
	}
	return connect.NewResponse(&ctrlv1.GetWorkspaceResponse{Workspace: f.watch[len(f.watch)-1]}), nil
}

func (f *fake) WatchWorkspace(_ context.Context, _ *connect.Request[ctrlv1.WatchWorkspaceRequest], s *connect.ServerStream[ctrlv1.WatchWorkspaceResponse]) error {
	for _, ws := range f.watch {
		if err := s.Send(&ctrlv1.WatchWorkspaceResponse{Workspace: ws}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fake) IssueSession(_ context.Context, r *connect.Request[ctrlv1.IssueSessionRequest]) (*connect.Response[ctrlv1.IssueSessionResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tok := fmt.Sprintf("sess-%d", len(f.issued)+1)
	f.issued = append(f.issued, tok)
	return connect.NewResponse(&ctrlv1.IssueSessionResponse{
		SessionId: "ses_" + tok, Token: tok, Endpoint: f.endpoint,
		ExpiresAt: timestamppb.New(time.Now().Add(f.sessionTTL)),
	}), nil
}

func (f *fake) StartProcess(_ context.Context, r *connect.Request[datav1.StartProcessRequest], s *connect.ServerStream[datav1.ProcessEvent]) error {
	if err := f.authorize(r.Header()); err != nil {
		return err
	}
	f.mu.Lock()
	delay := f.startDelay
	f.mu.Unlock()
	time.Sleep(delay) // a slow start: the process runs whether or not the caller still waits
	for _, ev := range []*datav1.ProcessEvent{
		{Event: &datav1.ProcessEvent_Started_{Started: &datav1.ProcessEvent_Started{Pid: 42}}},
		{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte("out1 ")}},
		{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte("out2")}},
		{Event: &datav1.ProcessEvent_Exited_{Exited: &datav1.ProcessEvent_Exited{}}},
	} {
		if err := s.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

func (f *fake) SignalProcess(_ context.Context, r *connect.Request[datav1.SignalProcessRequest]) (*connect.Response[datav1.SignalProcessResponse], error) {
	if err := f.authorize(r.Header()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals = append(f.signals, fmt.Sprintf("%d %s", r.Msg.GetProcess().GetPid(), r.Msg.GetSignal()))
	return connect.NewResponse(&datav1.SignalProcessResponse{}), nil
}

// TestExecKillsAProcessStartedAfterItsDeadline: a process whose started
// event comes after Exec's context ended is killed once that event names
// it, and Exec reports the context's end.
func TestExecKillsAProcessStartedAfterItsDeadline(t *testing.T) {
	f, c := newFake(t)
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.startDelay = 300 * time.Millisecond
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := ws.Exec(ctx, []string{"sleep", "1000"}, ExecOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Exec past its deadline: %v, want context.DeadlineExceeded", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		f.mu.Lock()
		signals := fmt.Sprint(f.signals)
		f.mu.Unlock()
		if signals == "[42 SIGKILL]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("signals sent: %s, want [42 SIGKILL]", signals)
		}
	}
}

func (f *fake) ListProcesses(_ context.Context, r *connect.Request[datav1.ListProcessesRequest]) (*connect.Response[datav1.ListProcessesResponse], error) {
	if err := f.authorize(r.Header()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	huge := f.hugeList
	f.mu.Unlock()
	if huge { // a replaced guest agent's answer
		return connect.NewResponse(&datav1.ListProcessesResponse{Processes: []*datav1.ProcessInfo{{Pid: 42, Args: []string{strings.Repeat("a", maxDataPlaneMessage)}}}}), nil
	}
	return connect.NewResponse(&datav1.ListProcessesResponse{Processes: []*datav1.ProcessInfo{{Pid: 42, Args: []string{"sleep", "1"}}}}), nil
}

// TestDataPlaneMessagesAreBounded: a message of the data plane over
// maxDataPlaneMessage, which a guest whose agent was replaced may send, is
// refused rather than read whole.
func TestDataPlaneMessagesAreBounded(t *testing.T) {
	f, c := newFake(t)
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Processes(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.hugeList = true
	f.mu.Unlock()
	if _, err := ws.Processes(t.Context()); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a message over the bound: %v, want resource_exhausted", err)
	}
}

func (f *fake) WriteFile(_ context.Context, s *connect.ClientStream[datav1.WriteFileRequest]) (*connect.Response[datav1.WriteFileResponse], error) {
	if err := f.authorize(s.RequestHeader()); err != nil {
		f.mu.Lock()
		after := f.refuseAfter
		f.mu.Unlock()
		for received := 0; after > 0 && received < after && s.Receive(); {
			received += len(s.Msg().GetData())
		}
		return nil, err
	}
	var (
		start     *datav1.WriteFileStart
		chunks    [][]byte
		size      int
		committed bool
	)
	for s.Receive() {
		switch p := s.Msg().GetPart().(type) {
		case *datav1.WriteFileRequest_Start:
			if start != nil || chunks != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("start is not first"))
			}
			start = p.Start
		case *datav1.WriteFileRequest_Data:
			chunks = append(chunks, p.Data)
			size += len(p.Data)
		case *datav1.WriteFileRequest_Commit:
			committed = true
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if !committed {
		return nil, connect.NewError(connect.CodeAborted, errors.New("no commit"))
	}
	if start.Size != nil && start.GetSize() != uint64(size) {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("size mismatch"))
	}
	f.mu.Lock()
	f.chunks = chunks
	f.mu.Unlock()
	return connect.NewResponse(&datav1.WriteFileResponse{File: &datav1.FileInfo{Path: start.GetPath(), Size: uint64(size)}}), nil
}

func TestCreateWorkspaceFailed(t *testing.T) {
	f, c := newFake(t)
	f.watch = []*ctrlv1.Workspace{
		{WorkspaceId: "ws_1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING},
		{WorkspaceId: "ws_1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, Failure: &ctrlv1.WorkspaceFailure{
			Reason: ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT, Stage: ctrlv1.FailureStage_FAILURE_STAGE_WAITING_FOR_READINESS, Message: "no answer",
		}},
	}
	_, err := c.CreateWorkspace(t.Context(), CreateOptions{})
	var se *StateError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want a *StateError", err)
	}
	if want := "workspace ws_1 FAILED: TIMED_OUT at stage WAITING_FOR_READINESS: no answer"; err.Error() != want {
		t.Errorf("err = %q, want %q", err, want)
	}
	d, ok := FailureOf(err)
	if !ok || d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT || d.GetObservedWorkspace().GetWorkspaceId() != "ws_1" {
		t.Errorf("FailureOf = %v, %v", d, ok)
	}
}

// withSession returns the handle of ws_1 once a call issued its first
// session (sess-1).
func withSession(t *testing.T, c *Client) *Workspace {
	t.Helper()
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Processes(t.Context()); err != nil {
		t.Fatal(err)
	}
	return ws
}

func TestSessionReissuedWhenExpired(t *testing.T) {
	f, c := newFake(t)
	ws := withSession(t, c)
	f.mu.Lock()
	f.expireNext = true
	f.mu.Unlock()
	procs, err := ws.Processes(t.Context())
	if err != nil || len(procs) != 1 {
		t.Fatalf("Processes after the session expired = %v, %v", procs, err)
	}
	f.mu.Lock()
	if got := strings.Join(f.issued, ","); got != "sess-1,sess-2" {
		t.Errorf("issued %s, want a second session", got)
	}
	if f.auth["ListProcesses"] != "Bearer sess-2" {
		t.Errorf("retry sent %q", f.auth["ListProcesses"])
	}

	// The same for a stream, and an upload that can seek back.
	f.expireNext = true
	f.mu.Unlock()
	var out bytes.Buffer
	if _, err := ws.Exec(t.Context(), []string{"true"}, ExecOptions{Stdout: &out}); err != nil || out.String() != "out1 out2" {
		t.Errorf("Exec after the session expired = %v, %q", err, out.String())
	}
	f.mu.Lock()
	f.expireNext = true
	f.mu.Unlock()
	err = ws.WriteFile(t.Context(), "/f", []byte("hello"), 0)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil || string(bytes.Join(f.chunks, nil)) != "hello" {
		t.Errorf("WriteFile after the session expired = %v, %q", err, bytes.Join(f.chunks, nil))
	}
	if len(f.issued) != 4 {
		t.Errorf("issued %v, want 4 sessions", f.issued)
	}
}

// An upload from a reader that cannot seek back, refused for its session
// after it read, is sent again with a new session from what it read: the
// reader is read once.
func TestStreamedUploadSentAgain(t *testing.T) {
	f, c := newFake(t)
	ws := withSession(t, c)
	f.mu.Lock()
	f.expireNext, f.refuseAfter = true, 1
	f.mu.Unlock()
	data := bytes.Repeat([]byte("0123456789abcdef"), 3*ChunkSize/16+1)
	var progress []int64
	src := &onceReader{r: bytes.NewReader(data)}
	if _, err := ws.Upload(t.Context(), src, "/f", 0, WithProgress(func(n int64) { progress = append(progress, n) })); err != nil {
		t.Fatalf("an upload that met its session's expiry after reading: %v, want it sent again", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := strings.Join(f.issued, ","); got != "sess-1,sess-2" || !bytes.Equal(bytes.Join(f.chunks, nil), data) {
		t.Errorf("issued %s, wrote %d bytes; want a second session and the upload written whole", got, len(bytes.Join(f.chunks, nil)))
	}
	if !slices.IsSorted(progress) || slices.Compact(slices.Clone(progress))[len(progress)-1] != int64(len(data)) || len(slices.Compact(slices.Clone(progress))) != len(progress) {
		t.Errorf("progress %v, want it to rise to %d", progress, len(data))
	}
}

// onceReader is a reader that cannot seek back and fails a read after
// its end, as a pipe read twice would not give its bytes again.
type onceReader struct {
	r   io.Reader
	eof bool
}

func (o *onceReader) Read(p []byte) (int, error) {
	if o.eof {
		return 0, errors.New("read again after its end")
	}
	n, err := o.r.Read(p)
	o.eof = err == io.EOF
	return n, err
}

// A refused session is forgotten even when the call that met the refusal
// cannot be sent again (an upload that read more than it can hold): the
// Workspace's next call issues a new session instead of meeting the same
// refusal for the rest of the session's life.
func TestRefusedSessionForgottenWhenNotResent(t *testing.T) {
	f, c := newFake(t)
	ws := withSession(t, c)
	f.mu.Lock()
	f.expireNext, f.refuseAfter = true, rereadBytes+1
	f.mu.Unlock()
	// A MultiReader cannot seek back to its bytes.
	_, err := ws.Upload(t.Context(), io.MultiReader(bytes.NewReader(make([]byte, rereadBytes+ChunkSize))), "/f", 0)
	if !sessionExpired(err) {
		t.Fatalf("an upload that met its session's expiry after reading more than it holds: %v, want it refused", err)
	}
	if _, err := ws.Upload(t.Context(), io.MultiReader(strings.NewReader("second")), "/f", 0); err != nil {
		t.Fatalf("the next upload: %v, want it sent with a new session", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := strings.Join(f.issued, ","); got != "sess-1,sess-2" || string(bytes.Join(f.chunks, nil)) != "second" {
		t.Errorf("issued %s, wrote %q; want a second session and the second upload written", got, bytes.Join(f.chunks, nil))
	}
}

// TestSessionReissuedWhenNotValid: a session the data plane refuses as
// not valid for the execution (of an earlier start of the Workspace) is
// replaced, so that a handle outlives a stop and start; a revoked one is
// not: its revoker meant it.
func TestSessionReissuedWhenNotValid(t *testing.T) {
	f, c := newFake(t)
	ws := withSession(t, c)
	f.mu.Lock()
	f.refused["sess-1"] = ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED
	f.mu.Unlock()
	if _, err := ws.Processes(t.Context()); err != nil {
		t.Fatalf("Processes after a restart of the workspace: %v", err)
	}
	f.mu.Lock()
	f.refused["sess-2"] = ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED
	f.mu.Unlock()
	_, err := ws.Processes(t.Context())
	if d, _ := FailureOf(err); connect.CodeOf(err) != connect.CodeUnauthenticated || d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED {
		t.Errorf("Processes with a revoked session: %v, want it refused", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := strings.Join(f.issued, ","); got != "sess-1,sess-2" {
		t.Errorf("issued %s, want a second session for the restart and none for the revocation", got)
	}
}

// A session is renewed 30 s before its expiry, or in the second half of
// its life when that is shorter: a short one is not renewed at every call.
func TestSessionRenewedBeforeExpiry(t *testing.T) {
	f, c := newFake(t)
	f.sessionTTL = time.Second // within the 30 s margin, set before any call
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := ws.Processes(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(600 * time.Millisecond) // into the second half of its life
	if _, err := ws.Processes(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	if len(f.issued) != 2 {
		t.Errorf("issued %v, want one session for the first two calls and another for the third", f.issued)
	}
	f.sessionTTL = time.Hour
	f.mu.Unlock()
	s1, _ := ws.Session(t.Context())
	s2, _ := ws.Session(t.Context())
	if s1 != s2 || s1.Endpoint != f.endpoint {
		t.Errorf("sessions %v and %v, want one cached session at %s", s1, s2, f.endpoint)
	}
}

func TestFailureOfConnectError(t *testing.T) {
	err := connect.NewError(connect.CodeFailedPrecondition, errors.New("not available"))
	d, _ := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Stage: ctrlv1.FailureStage_FAILURE_STAGE_ISSUING_SESSION})
	err.AddDetail(d)
	got, ok := FailureOf(fmt.Errorf("wrapped: %w", err))
	if !ok || got.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_ISSUING_SESSION {
		t.Errorf("FailureOf = %v, %v", got, ok)
	}
	if _, ok := FailureOf(errors.New("plain")); ok {
		t.Error("FailureOf found a detail in a plain error")
	}
	// A refusal made before the server's handlers carries no detail: its
	// code gives the reason, as the server's own refusals have it.
	tooLarge := connect.NewError(connect.CodeResourceExhausted, errors.New("message size 9437272 is larger than configured max 8388608"))
	if got, ok := FailureOf(tooLarge); !ok || got.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED {
		t.Errorf("FailureOf a refusal without a detail = %v, %v, want RESOURCE_EXHAUSTED", got, ok)
	}
	if got, ok := FailureOf(connect.NewError(connect.CodeFailedPrecondition, errors.New("stopped"))); ok {
		t.Errorf("FailureOf failed_precondition without a detail = %v, want none", got)
	}
}
