package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
)

// fake is a control plane and a data plane on one server: the sessions it
// issues name the same server as their endpoint.
type fake struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	ctrlv1connect.UnimplementedSessionServiceHandler
	datav1connect.UnimplementedProcessServiceHandler
	datav1connect.UnimplementedFileServiceHandler

	endpoint   string
	watch      []*ctrlv1.Workspace // WatchWorkspace sends these, in order
	sessionTTL time.Duration

	mu         sync.Mutex
	calls      []string       // procedure names, in order
	proto      map[string]int // HTTP major version, by procedure
	created    *ctrlv1.CreateWorkspaceRequest
	issued     []string          // tokens, in order
	expired    map[string]bool   // tokens the data plane rejects as expired
	expireNext bool              // expire the token of the next data-plane call
	auth       map[string]string // Authorization of the last call, by procedure
	started    *datav1.StartProcessRequest
	input      []string // SendInput data, then "<close>"
	inputDone  chan struct{}
	writeStart *datav1.WriteFileStart
	chunks     [][]byte
	file       [][]byte // ReadFile sends these chunks
}

func newFake(t *testing.T) (*fake, *Client) {
	t.Helper()
	f := &fake{
		proto:      map[string]int{},
		auth:       map[string]string{},
		expired:    map[string]bool{},
		inputDone:  make(chan struct{}),
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
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		f.mu.Lock()
		f.calls = append(f.calls, method)
		f.proto[method] = r.ProtoMajor
		f.auth[method] = r.Header.Get("Authorization")
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	f.endpoint = srv.URL
	c := New(srv.URL+"/", "api-token")
	t.Cleanup(c.Close)
	return f, c
}

func (f *fake) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == method {
			n++
		}
	}
	return n
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

func (f *fake) CreateWorkspace(_ context.Context, r *connect.Request[ctrlv1.CreateWorkspaceRequest]) (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
	f.mu.Lock()
	f.created = r.Msg
	f.mu.Unlock()
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

func (f *fake) StartProcess(ctx context.Context, r *connect.Request[datav1.StartProcessRequest], s *connect.ServerStream[datav1.ProcessEvent]) error {
	if err := f.authorize(r.Header()); err != nil {
		return err
	}
	f.mu.Lock()
	f.started = r.Msg
	f.mu.Unlock()
	send := func(ev *datav1.ProcessEvent) error { return s.Send(ev) }
	if err := send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Started_{Started: &datav1.ProcessEvent_Started{Pid: 42}}}); err != nil {
		return err
	}
	if r.Msg.GetStdin() {
		// Echo the input like cat, once it is closed.
		select {
		case <-f.inputDone:
		case <-ctx.Done():
			return ctx.Err()
		}
		f.mu.Lock()
		in := strings.Join(f.input[:len(f.input)-1], "")
		f.mu.Unlock()
		if err := send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte(in)}}); err != nil {
			return err
		}
		return send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Exited_{Exited: &datav1.ProcessEvent_Exited{}}})
	}
	for _, ev := range []*datav1.ProcessEvent{
		{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte("out1 ")}},
		{Event: &datav1.ProcessEvent_Stderr{Stderr: []byte("err1 ")}},
		{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte("out2")}},
		{Event: &datav1.ProcessEvent_Exited_{Exited: &datav1.ProcessEvent_Exited{ExitCode: 3}}},
	} {
		if err := send(ev); err != nil {
			return err
		}
	}
	return nil
}

func (f *fake) ConnectProcess(_ context.Context, r *connect.Request[datav1.ConnectProcessRequest], s *connect.ServerStream[datav1.ProcessEvent]) error {
	if err := f.authorize(r.Header()); err != nil {
		return err
	}
	if r.Msg.GetProcess().GetTag() != "build" {
		return connect.NewError(connect.CodeNotFound, errors.New("no such process"))
	}
	if err := s.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte("buffered")}}); err != nil {
		return err
	}
	return s.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Exited_{Exited: &datav1.ProcessEvent_Exited{Signal: "SIGKILL"}}})
}

func (f *fake) SendInput(_ context.Context, r *connect.Request[datav1.SendInputRequest]) (*connect.Response[datav1.SendInputResponse], error) {
	if err := f.authorize(r.Header()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Msg.GetProcess().GetPid() != 42 {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such process"))
	}
	f.input = append(f.input, string(r.Msg.GetData()))
	return connect.NewResponse(&datav1.SendInputResponse{}), nil
}

func (f *fake) CloseInput(_ context.Context, r *connect.Request[datav1.CloseInputRequest]) (*connect.Response[datav1.CloseInputResponse], error) {
	if err := f.authorize(r.Header()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.input = append(f.input, "<close>")
	close(f.inputDone)
	return connect.NewResponse(&datav1.CloseInputResponse{}), nil
}

func (f *fake) ListProcesses(_ context.Context, r *connect.Request[datav1.ListProcessesRequest]) (*connect.Response[datav1.ListProcessesResponse], error) {
	if err := f.authorize(r.Header()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&datav1.ListProcessesResponse{Processes: []*datav1.ProcessInfo{{Pid: 42, Args: []string{"sleep", "1"}}}}), nil
}

func (f *fake) WriteFile(_ context.Context, s *connect.ClientStream[datav1.WriteFileRequest]) (*connect.Response[datav1.WriteFileResponse], error) {
	if err := f.authorize(s.RequestHeader()); err != nil {
		return nil, err
	}
	var (
		start  *datav1.WriteFileStart
		chunks [][]byte
		size   int
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
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.writeStart, f.chunks = start, chunks
	f.mu.Unlock()
	return connect.NewResponse(&datav1.WriteFileResponse{File: &datav1.FileInfo{Path: start.GetPath(), Size: uint64(size)}}), nil
}

func (f *fake) ReadFile(_ context.Context, r *connect.Request[datav1.ReadFileRequest], s *connect.ServerStream[datav1.ReadFileResponse]) error {
	if err := f.authorize(r.Header()); err != nil {
		return err
	}
	if r.Msg.GetPath() != "/work/data" {
		return connect.NewError(connect.CodeNotFound, errors.New("no such file"))
	}
	for _, c := range f.file {
		if err := s.Send(&datav1.ReadFileResponse{Data: c}); err != nil {
			return err
		}
	}
	return nil
}

func TestCreateWorkspaceWaitsUntilAvailable(t *testing.T) {
	f, c := newFake(t)
	ws, err := c.CreateWorkspace(t.Context(), CreateOptions{Template: "base@r1", CPUMillis: 500, DiskBytes: 1 << 30, Labels: map[string]string{"team": "ml"}})
	if err != nil {
		t.Fatal(err)
	}
	if ws.ID() != "ws_1" || ws.Info().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.Info().GetGeneration() != 1 {
		t.Errorf("workspace = %v, want ws_1 AVAILABLE at generation 1", ws.Info())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.created.GetCommand().GetCommandId() == "" {
		t.Error("the create has no command_id")
	}
	want := &ctrlv1.WorkspaceCreateSpec{
		Template:  &ctrlv1.TemplateSelector{TemplateId: "base", Revision: "r1"},
		Resources: &ctrlv1.ResourceRequest{CpuMillis: 500, MemoryBytes: DefaultMemoryBytes, WritableLayerBytes: 1 << 30},
	}
	if !proto.Equal(f.created.GetSpec(), want) {
		t.Errorf("spec = %v, want %v", f.created.GetSpec(), want)
	}
	if f.auth["CreateWorkspace"] != "Bearer api-token" {
		t.Errorf("Authorization = %q", f.auth["CreateWorkspace"])
	}
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

func TestWorkspaceNotFound(t *testing.T) {
	_, c := newFake(t)
	_, err := c.Workspace(t.Context(), "ws_2")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("err = %v, want not_found", err)
	}
}

// recorder keeps the writes of several writers in one order.
type recorder struct {
	mu     sync.Mutex
	writes []string
}

func (r *recorder) writer(name string) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.writes = append(r.writes, name+":"+string(b))
		return len(b), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestExecStreamsOutputInOrder(t *testing.T) {
	f, c := newFake(t)
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	status, err := ws.Exec(t.Context(), []string{"sh", "-c", "x"}, ExecOptions{
		Env: map[string]string{"A": "1"}, Cwd: "/w", User: "dev", Tag: "t",
		Stdout: rec.writer("out"), Stderr: rec.writer("err"),
		PTY: &PTYSize{Cols: 80, Rows: 24},
	})
	if err != nil {
		t.Fatal(err)
	}
	if status != (ExitStatus{Code: 3}) || status.Success() {
		t.Errorf("status = %v, want exit status 3", status)
	}
	if got, want := strings.Join(rec.writes, "|"), "out:out1 |err:err1 |out:out2"; got != want {
		t.Errorf("writes = %q, want %q", got, want)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := &datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "x"}, Env: map[string]string{"A": "1"}, Cwd: "/w", User: "dev", Tag: "t",
		Pty: &datav1.Pty{Cols: 80, Rows: 24},
	}
	if !proto.Equal(f.started, want) {
		t.Errorf("request = %v, want %v", f.started, want)
	}
	if f.auth["StartProcess"] != "Bearer sess-1" {
		t.Errorf("data plane Authorization = %q, want the session token", f.auth["StartProcess"])
	}
}

func TestExecSendsStdinThenCloses(t *testing.T) {
	f, c := newFake(t)
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	// More than one SendInput's worth.
	in := strings.Repeat("x", inputChunk) + "tail"
	var out bytes.Buffer
	status, err := ws.Exec(t.Context(), []string{"cat"}, ExecOptions{Stdin: strings.NewReader(in), Stdout: &out})
	if err != nil || !status.Success() {
		t.Fatalf("Exec = %v, %v", status, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.started.GetStdin() {
		t.Error("stdin was not asked for")
	}
	if got := f.input; len(got) != 3 || got[0]+got[1] != in || got[2] != "<close>" {
		t.Errorf("input = %d messages, want the input in 2 then <close>", len(got))
	}
	if out.String() != in {
		t.Errorf("stdout has %d bytes, want the %d of the input", out.Len(), len(in))
	}
}

func TestStartAndConnect(t *testing.T) {
	_, c := newFake(t)
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ws.Start(t.Context(), []string{"make"}, ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid() != 42 {
		t.Errorf("pid = %d", p.Pid())
	}
	if st, err := p.Wait(); err != nil || st.Code != 3 {
		t.Errorf("Wait = %v, %v", st, err)
	}

	var out bytes.Buffer
	p, err = ws.Connect(t.Context(), Tag("build"), &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil || st.Signal != "SIGKILL" || out.String() != "buffered" {
		t.Errorf("Connect: %v, %v, output %q", st, err, out.String())
	}

	p, _ = ws.Connect(t.Context(), Tag("nope"), nil, nil)
	if _, err := p.Wait(); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Connect to an unknown process: %v, want not_found", err)
	}
}

func TestUploadSendsStartAndChunks(t *testing.T) {
	f, c := newFake(t)
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 2*ChunkSize+ChunkSize/2)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var progress []int64
	info, err := ws.Upload(t.Context(), bytes.NewReader(data), "/work/data", 0o600, AsUser("dev"),
		WithProgress(func(n int64) { progress = append(progress, n) }))
	if err != nil {
		t.Fatal(err)
	}
	if info.GetSize() != uint64(len(data)) {
		t.Errorf("size = %d", info.GetSize())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if want := (&datav1.WriteFileStart{Path: "/work/data", User: "dev", Mode: 0o600}); !proto.Equal(f.writeStart, want) {
		t.Errorf("start = %v, want %v", f.writeStart, want)
	}
	if len(f.chunks) != 3 || len(f.chunks[0]) != ChunkSize || len(f.chunks[2]) != ChunkSize/2 {
		t.Errorf("%d chunks, want 1 MiB, 1 MiB, 512 KiB", len(f.chunks))
	}
	if !bytes.Equal(bytes.Join(f.chunks, nil), data) {
		t.Error("the chunks differ from the input")
	}
	if fmt.Sprint(progress) != fmt.Sprint([]int64{ChunkSize, 2 * ChunkSize, int64(len(data))}) {
		t.Errorf("progress = %v", progress)
	}
	if f.proto["WriteFile"] != 2 {
		t.Errorf("WriteFile went over HTTP/%d, want HTTP/2", f.proto["WriteFile"])
	}
}

func TestDownloadWritesChunksInOrder(t *testing.T) {
	f, c := newFake(t)
	f.file = [][]byte{[]byte("a"), []byte("bb"), []byte("ccc")}
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	n, err := ws.Download(t.Context(), "/work/data", &out)
	if err != nil || n != 6 || out.String() != "abbccc" {
		t.Errorf("Download = %d, %v, %q", n, err, out.String())
	}
	if _, err := ws.ReadFile(t.Context(), "/nope"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("ReadFile of a missing file: %v, want not_found", err)
	}
}

func TestSessionReissuedWhenExpired(t *testing.T) {
	f, c := newFake(t)
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Processes(t.Context()); err != nil {
		t.Fatal(err)
	}
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

func TestSessionRenewedBeforeExpiry(t *testing.T) {
	f, c := newFake(t)
	f.sessionTTL = 10 * time.Second // within the 30 s margin, set before any call
	ws, err := c.Workspace(t.Context(), "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := ws.Processes(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	if len(f.issued) != 2 {
		t.Errorf("issued %v, want a new session for each call", f.issued)
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
}
