package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

var created = timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))

// ctrlFake serves the WorkspaceService and TemplateService methods the tests
// call, records the requests, and answers from what a test put in it.
type ctrlFake struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	ctrlv1connect.UnimplementedTemplateServiceHandler

	mu    sync.Mutex
	calls []string
	reqs  []proto.Message
	proto map[string]int    // HTTP major version, by procedure
	auth  map[string]string // Authorization header, by procedure

	ws       *ctrlv1.Workspace   // returned by the lifecycle calls
	watch    []*ctrlv1.Workspace // sent by WatchWorkspace, in order
	template *ctrlv1.Template

	imported []byte // the chunks of the last import, concatenated
	chunks   int
}

func (f *ctrlFake) record(r connect.AnyRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Spec().Procedure[strings.LastIndex(r.Spec().Procedure, "/")+1:])
	f.reqs = append(f.reqs, r.Any().(proto.Message))
}

func (f *ctrlFake) got() ([]string, []proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.reqs
}

func (f *ctrlFake) CreateWorkspace(_ context.Context, r *connect.Request[ctrlv1.CreateWorkspaceRequest]) (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.CreateWorkspaceResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) GetWorkspace(_ context.Context, r *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.GetWorkspaceResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) StopWorkspace(_ context.Context, r *connect.Request[ctrlv1.StopWorkspaceRequest]) (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.StopWorkspaceResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) UpdateWorkspaceLabels(_ context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceLabelsRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceLabelsResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceLabelsResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) UpdateWorkspaceMemory(_ context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceMemoryRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceMemoryResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceMemoryResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) ResizeWorkspaceWritableLayer(_ context.Context, r *connect.Request[ctrlv1.ResizeWorkspaceWritableLayerRequest]) (*connect.Response[ctrlv1.ResizeWorkspaceWritableLayerResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) UpdateWorkspaceExpiration(_ context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceExpirationRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceExpirationResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceExpirationResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) WatchWorkspace(_ context.Context, r *connect.Request[ctrlv1.WatchWorkspaceRequest], s *connect.ServerStream[ctrlv1.WatchWorkspaceResponse]) error {
	f.record(r)
	for _, ws := range f.watch {
		if err := s.Send(&ctrlv1.WatchWorkspaceResponse{Workspace: ws}); err != nil {
			return err
		}
	}
	return nil
}

// env is one test's fake on an h2c server, as internal/server serves.
func newCtrlEnv(t *testing.T) (*env, *ctrlFake) {
	t.Helper()
	f := &ctrlFake{proto: map[string]int{}, auth: map[string]string{}, ws: testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(f))
	mux.Handle(ctrlv1connect.NewTemplateServiceHandler(f))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		method := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
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

	home := t.TempDir()
	t.Setenv(envAddr, "")
	t.Setenv(envToken, "")
	t.Setenv(envHome, home)
	return &env{addr: srv.URL, home: home, token: "tok"}, f
}

func testWorkspace(state ctrlv1.WorkspaceState) *ctrlv1.Workspace {
	return &ctrlv1.Workspace{
		WorkspaceId: "ws_1",
		State:       state,
		Spec: &ctrlv1.WorkspaceSpec{
			Template:          &ctrlv1.TemplateRef{TemplateId: "base", Revision: "sha256-abc"},
			Resources:         &ctrlv1.ResourceRequest{CpuMillis: 500, MemoryBytes: 1 << 30},
			ResourcesRevision: 3,
		},
		LabelsRevision: 4,
		Labels:         map[string]string{"team": "ml"},
		CreatedAt:      created,
	}
}

func TestWorkspaceCreateSendsSpec(t *testing.T) {
	e, f := newCtrlEnv(t)
	before := time.Now()
	stdout, _ := e.call(t, "", "ws", "create", "--template", "base@sha256-abc", "--cpu", "500", "--memory", "1Gi", "--disk", "10Gi",
		"--network", "public-internet", "--expire-in", "2h", "--expire-action", "delete",
		"--label", "team=ml", "--annotation", "note=x", "--command-id", "c1")

	calls, reqs := f.got()
	if strings.Join(calls, ",") != "CreateWorkspace" {
		t.Fatalf("calls = %v", calls)
	}
	req := reqs[0].(*ctrlv1.CreateWorkspaceRequest)
	deadline := req.GetSpec().GetExpiration().GetDeadline().AsTime()
	if d := deadline.Sub(before); d < 2*time.Hour || d > 2*time.Hour+time.Minute {
		t.Errorf("deadline %v is not 2h after %v", deadline, before)
	}
	want := &ctrlv1.CreateWorkspaceRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: "c1"},
		Spec: &ctrlv1.WorkspaceCreateSpec{
			Template:      &ctrlv1.TemplateSelector{TemplateId: "base", Revision: "sha256-abc"},
			Resources:     &ctrlv1.ResourceRequest{CpuMillis: 500, MemoryBytes: 1073741824, WritableLayerBytes: 10 << 30},
			NetworkPolicy: &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET},
			Expiration: &ctrlv1.WorkspaceExpirationPolicy{
				Deadline: req.GetSpec().GetExpiration().GetDeadline(),
				Action:   ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE,
			},
		},
		Labels:      map[string]string{"team": "ml"},
		Annotations: map[string]string{"note": "x"},
	}
	if !proto.Equal(req, want) {
		t.Errorf("request = %v\nwant %v", req, want)
	}

	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if got := strings.Join(strings.Fields(lines[0]), " "); got != "ID STATE GEN TEMPLATE CPU MEMORY DISK VOLUME LABELS CREATED" {
		t.Errorf("header = %q", got)
	}
	if got, want := strings.Join(strings.Fields(lines[1]), " "), "ws_1 CREATING 0 base@sha256-abc 500m 1Gi - - team=ml 2025-03-01T12:00:00Z"; got != want {
		t.Errorf("row = %q, want %q", got, want)
	}
}

func TestWorkspaceCreateDefaults(t *testing.T) {
	e, f := newCtrlEnv(t)
	e.call(t, "", "ws", "create")
	_, reqs := f.got()
	want := &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 512 << 20}}
	if got := reqs[0].(*ctrlv1.CreateWorkspaceRequest).GetSpec(); !proto.Equal(got, want) {
		t.Errorf("spec = %v, want %v", got, want)
	}
}

func TestWorkspaceCreateRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory", "1GB"}, "--memory"},
		{[]string{"--template", "base@"}, "ID@REVISION"},
		{[]string{"--network", "open"}, "deny-all or public-internet"},
		{[]string{"--expire-action", "stop"}, "needs a deadline"},
		{[]string{"--expire-in", "1h", "--expire-at", "2030-01-01T00:00:00Z"}, "expire-at"},
		{[]string{"--expire-at", "tomorrow"}, "RFC 3339"},
		{[]string{"--expire-in", "1h", "--expire-action", "pause"}, "stop or delete"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			e, f := newCtrlEnv(t)
			_, _, err := e.run(t, "", append([]string{"ws", "create", "--addr", e.addr, "--token", "t"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if calls, _ := f.got(); len(calls) != 0 {
				t.Errorf("calls = %v, want none", calls)
			}
		})
	}
}

func TestWorkspaceCreateWaitFollowsDelivery(t *testing.T) {
	e, f := newCtrlEnv(t)
	delivering := func(done uint64) *ctrlv1.Workspace {
		ws := testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)
		ws.Delivery = &ctrlv1.TemplateDeliveryObservation{
			State:          ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_NOT_READY,
			Reason:         ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_DISTRIBUTING,
			BytesTotal:     40 << 20,
			BytesDelivered: done,
		}
		return ws
	}
	available := testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	available.Generation = 1
	f.watch = []*ctrlv1.Workspace{delivering(0), delivering(12900000), available}

	_, stderr := e.call(t, "", "ws", "create", "--wait")
	calls, reqs := f.got()
	if strings.Join(calls, ",") != "CreateWorkspace,WatchWorkspace" {
		t.Fatalf("calls = %v", calls)
	}
	if id := reqs[1].(*ctrlv1.WatchWorkspaceRequest).GetWorkspaceId(); id != "ws_1" {
		t.Errorf("watched %q, want ws_1", id)
	}
	if got := f.auth["WatchWorkspace"]; got != "Bearer tok" {
		t.Errorf("WatchWorkspace Authorization = %q, want Bearer tok", got)
	}
	for _, want := range []string{
		"delivering template: 0.0 MiB / 40.0 MiB (0%)\n",
		"delivering template: 12.3 MiB / 40.0 MiB (30%)\n",
		"CREATING → AVAILABLE in ",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "\r") {
		t.Errorf("stderr is no terminal but has \\r:\n%q", stderr)
	}
}

func TestWorkspaceWaitReportsFailure(t *testing.T) {
	e, f := newCtrlEnv(t)
	failed := testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED)
	failed.Failure = &ctrlv1.WorkspaceFailure{
		Reason:  ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT,
		Stage:   ctrlv1.FailureStage_FAILURE_STAGE_WAITING_FOR_READINESS,
		Message: "guest agent did not answer",
	}
	f.watch = []*ctrlv1.Workspace{testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING), failed}
	_, stderr, err := e.run(t, "", "ws", "create", "--wait", "--addr", e.addr, "--token", "t")
	if err == nil {
		t.Fatal("create --wait of a Workspace that FAILED succeeded")
	}
	for _, want := range []string{"ws_1", "TIMED_OUT", "WAITING_FOR_READINESS", "guest agent did not answer"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if !strings.Contains(stderr, "CREATING → FAILED(TIMED_OUT)") {
		t.Errorf("stderr lacks the transition:\n%s", stderr)
	}
}

func TestWorkspaceWaitStreamEndsEarly(t *testing.T) {
	e, f := newCtrlEnv(t)
	f.watch = []*ctrlv1.Workspace{testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)}
	_, _, err := e.run(t, "", "ws", "create", "--wait", "--addr", e.addr, "--token", "t")
	if err == nil || !strings.Contains(err.Error(), "ended before") {
		t.Fatalf("err = %v, want the watch to have ended before AVAILABLE", err)
	}
}

func TestWorkspaceStopForceWaits(t *testing.T) {
	e, f := newCtrlEnv(t)
	f.ws = testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING)
	f.watch = []*ctrlv1.Workspace{f.ws, testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)}
	_, stderr := e.call(t, "", "ws", "stop", "ws_1", "--force", "--wait")
	calls, reqs := f.got()
	if strings.Join(calls, ",") != "StopWorkspace,WatchWorkspace" {
		t.Fatalf("calls = %v", calls)
	}
	if r := reqs[0].(*ctrlv1.StopWorkspaceRequest); r.GetMode() != ctrlv1.StopMode_STOP_MODE_FORCE || r.GetWorkspaceId() != "ws_1" {
		t.Errorf("request = %v, want a FORCE stop of ws_1", r)
	}
	if !strings.Contains(stderr, "STOPPING → STOPPED") {
		t.Errorf("stderr = %q", stderr)
	}

	e.call(t, "", "ws", "stop", "ws_1")
	if _, reqs := f.got(); reqs[2].(*ctrlv1.StopWorkspaceRequest).GetMode() != ctrlv1.StopMode_STOP_MODE_NORMAL {
		t.Errorf("stop without --force = %v, want NORMAL", reqs[2])
	}
}

func TestWorkspaceLabelReadsRevision(t *testing.T) {
	e, f := newCtrlEnv(t)
	e.call(t, "", "ws", "label", "ws_1", "team=infra")
	calls, reqs := f.got()
	if strings.Join(calls, ",") != "GetWorkspace,UpdateWorkspaceLabels" {
		t.Fatalf("calls = %v", calls)
	}
	if r := reqs[1].(*ctrlv1.UpdateWorkspaceLabelsRequest); r.GetExpectedLabelsRevision() != 4 || r.GetLabels()["team"] != "infra" {
		t.Errorf("request = %v", r)
	}
}

func TestWorkspaceMemoryAndDisk(t *testing.T) {
	e, f := newCtrlEnv(t)
	e.call(t, "", "ws", "memory", "ws_1", "2Gi")
	e.call(t, "", "ws", "disk", "ws_1", "10Gi", "--expected-resources-revision", "7")
	calls, reqs := f.got()
	if strings.Join(calls, ",") != "GetWorkspace,UpdateWorkspaceMemory,ResizeWorkspaceWritableLayer" {
		t.Fatalf("calls = %v", calls)
	}
	if r := reqs[1].(*ctrlv1.UpdateWorkspaceMemoryRequest); r.GetExpectedResourcesRevision() != 3 || r.GetMemoryBytes() != 2<<30 || r.GetCommand().GetCommandId() == "" {
		t.Errorf("memory request = %v", r)
	}
	if r := reqs[2].(*ctrlv1.ResizeWorkspaceWritableLayerRequest); r.GetExpectedResourcesRevision() != 7 || r.GetWritableLayerBytes() != 10<<30 {
		t.Errorf("disk request = %v", r)
	}
}

func TestWorkspaceExpire(t *testing.T) {
	e, f := newCtrlEnv(t)
	e.call(t, "", "ws", "expire", "ws_1", "--at", "2030-01-02T03:04:05Z", "--action", "delete")
	e.call(t, "", "ws", "expire", "ws_1", "--clear")
	_, reqs := f.got()
	set := reqs[0].(*ctrlv1.UpdateWorkspaceExpirationRequest).GetChange().GetSet()
	if got := set.GetDeadline().AsTime(); !got.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) ||
		set.GetAction() != ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE {
		t.Errorf("set = %v", set)
	}
	if reqs[1].(*ctrlv1.UpdateWorkspaceExpirationRequest).GetChange().GetClear() == nil {
		t.Errorf("--clear sent %v", reqs[1])
	}
	for _, args := range [][]string{{}, {"--clear", "--action", "stop"}, {"--in", "1h", "--clear"}} {
		if _, _, err := e.run(t, "", append([]string{"ws", "expire", "ws_1", "--addr", e.addr, "--token", "t"}, args...)...); err == nil {
			t.Errorf("expire %v succeeded", args)
		}
	}
}

func TestWorkspaceWatchJSONLines(t *testing.T) {
	e, f := newCtrlEnv(t)
	failed := testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED)
	failed.Failure = &ctrlv1.WorkspaceFailure{Reason: ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED}
	f.watch = []*ctrlv1.Workspace{testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING), failed}

	stdout, _ := e.call(t, "", "ws", "watch", "ws_1", "-o", "json")
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), stdout)
	}
	for i, l := range lines {
		var m ctrlv1.WatchWorkspaceResponse
		if err := protojson.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if !proto.Equal(m.GetWorkspace(), f.watch[i]) {
			t.Errorf("line %d = %v, want %v", i, &m, f.watch[i])
		}
	}

	stdout, _ = e.call(t, "", "ws", "watch", "ws_1")
	lines = strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") || strings.Fields(lines[2])[1] != "FAILED(RESOURCE_EXHAUSTED)" {
		t.Errorf("table watch:\n%s", stdout)
	}
	if strings.Index(lines[0], "STATE") != strings.Index(lines[1], "CREATING") {
		t.Errorf("rows are not aligned with the header:\n%s", stdout)
	}
}

func TestWorkspaceCreateJSON(t *testing.T) {
	e, _ := newCtrlEnv(t)
	stdout, _ := e.call(t, "", "ws", "create", "-o", "json")
	var resp ctrlv1.CreateWorkspaceResponse
	if err := protojson.Unmarshal([]byte(stdout), &resp); err != nil {
		t.Fatalf("stdout is not a CreateWorkspaceResponse: %v\n%s", err, stdout)
	}
	if !proto.Equal(resp.GetWorkspace(), testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)) {
		t.Errorf("workspace = %v", resp.GetWorkspace())
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		err  bool
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "512Mi", want: 512 << 20},
		{in: "1Gi", want: 1073741824},
		{in: "4Ki", want: 4096},
		{in: "2Ti", want: 2 << 40},
		{in: "2G", want: 2000000000},
		{in: "500M", want: 500000000},
		{in: "3k", want: 3000},
		{in: "3K", want: 3000},
		{in: "1T", want: 1e12},
		{in: "", err: true},
		{in: "Mi", err: true},
		{in: "1.5Gi", err: true},
		{in: "-1Gi", err: true},
		{in: "1GB", err: true},
		{in: "1gi", err: true},
		{in: " 1Gi", err: true},
		{in: "16777216Ti", err: true}, // 2^64 bytes
	} {
		got, err := parseSize("memory", tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	for n, want := range map[uint64]string{0: "-", 512 << 20: "512Mi", 1 << 30: "1Gi", 1536 << 20: "1536Mi", 1000: "1000", 2 << 40: "2Ti"} {
		if got := formatSize(n); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestReporterOnTerminalRewritesInPlace(t *testing.T) {
	var buf strings.Builder
	out := &statusLine{w: &buf, tty: true}
	ws := testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)
	r := &reporter{out: out, last: ws, since: time.Now()}
	for _, done := range []uint64{12900000, 0} { // a shorter line pads over the longer one
		w := proto.CloneOf(ws)
		w.Delivery = &ctrlv1.TemplateDeliveryObservation{BytesTotal: 40 << 20, BytesDelivered: done}
		r.observe(w)
	}
	r.observe(testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE))
	got := buf.String()
	want := "\rdelivering template: 12.3 MiB / 40.0 MiB (30%)" +
		"\rdelivering template: 0.0 MiB / 40.0 MiB (0%)  \n" +
		"CREATING → AVAILABLE in 0s\n"
	if got != want {
		t.Errorf("terminal output = %q\nwant %q", got, want)
	}
}
