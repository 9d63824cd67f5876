package cli

import (
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRunCLI) != "" { // a test runs this binary as the CLI
		Main(Root())
		os.Exit(0)
	}
	os.Exit(uptest.Main(m))
}

// newUpEnv returns an env on the package's deployment, which runs
// workspaces on runc, in a project of the test's own. Its calls are not
// recorded: tests read what a command did from the server.
func newUpEnv(t testing.TB) *env {
	t.Helper()
	d := uptest.Shared(t)
	home := cleanHome(t)
	return &env{addr: d.URL, home: home, token: d.Project(t)}
}

// newPlacedEnv is newEnv with the built-in template and a registered host
// that never reports: workspaces are placed and stored, and stay as they
// were created.
func newPlacedEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.srv.AddBuiltinTemplate(t)
	e.srv.RegisterHost(t, "h1")
	return e
}

// workspace reads a workspace from the server.
func (e *env) workspace(t *testing.T, id string) *ctrlv1.Workspace {
	t.Helper()
	cl := ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, e.addr, connect.WithInterceptors(bearer.Token(e.token)))
	resp, err := cl.GetWorkspace(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetWorkspace()
}

// createWorkspace runs `ws create -o json args...` and returns the
// Workspace it printed.
func (e *env) createWorkspace(t testing.TB, args ...string) *ctrlv1.Workspace {
	t.Helper()
	var resp ctrlv1.CreateWorkspaceResponse
	e.callJSON(t, &resp, append([]string{"ws", "create", "-o", "json"}, args...)...)
	return resp.GetWorkspace()
}

// baseRevision is the revision of the built-in template base.
func (e *env) baseRevision(t *testing.T) string {
	t.Helper()
	cl := ctrlv1connect.NewTemplateServiceClient(http.DefaultClient, e.addr, connect.WithInterceptors(bearer.Token(e.token)))
	resp, err := cl.GetTemplate(t.Context(), connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: "base"}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetTemplate().GetDefaultRevision()
}

// smallWorkspace are the flags of a workspace the deployment starts quickly.
var smallWorkspace = []string{"--cpu", "500", "--memory", "128Mi", "--disk", "64Mi"}

func TestWorkspaceCreateSendsSpec(t *testing.T) {
	e := newPlacedEnv(t)
	rev := e.baseRevision(t)
	before := time.Now()
	stdout, _ := e.call(t, "", "ws", "create", "--template", "base@"+rev, "--cpu", "500", "--memory", "1Gi", "--disk", "10Gi",
		"--network", "public-internet", "--expire-in", "2h", "--expire-action", "delete",
		"--label", "team=ml", "--annotation", "note=x", "--command-id", "c1")

	calls, _, reqs := e.got()
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
			Template:      &ctrlv1.TemplateSelector{TemplateId: "base", Revision: rev},
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
	if got := strings.Join(strings.Fields(lines[0]), " "); got != "ID STATE GEN TEMPLATE CPU MEMORY DISK VOLUME LABELS AGE" {
		t.Errorf("header = %q", got)
	}
	row := strings.Fields(lines[1])
	ws := e.workspace(t, row[0])
	created := age(ws.GetCreatedAt())
	if got, want := strings.Join(row, " "), ws.GetWorkspaceId()+" CREATING 0 base@"+rev+" 500m 1Gi 10Gi - team=ml "+created; got != want {
		t.Errorf("row = %q, want %q", got, want)
	}
}

func TestWorkspaceCreateDefaults(t *testing.T) {
	e := newPlacedEnv(t)
	e.call(t, "", "ws", "create")
	_, _, reqs := e.got()
	want := &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 512 << 20}}
	if got := reqs[0].(*ctrlv1.CreateWorkspaceRequest).GetSpec(); !proto.Equal(got, want) {
		t.Errorf("spec = %v, want %v", got, want)
	}
}

func TestWorkspaceCreateRejectsBadInput(t *testing.T) {
	e := newEnv(t)
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
			_, _, err := e.run(t, "", append([]string{"ws", "create", "--addr", e.addr, "--token", e.token}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if calls, _, _ := e.got(); len(calls) != 0 {
				t.Errorf("calls = %v, want none", calls)
			}
		})
	}
}

// deliveryProgress is what a line of template delivery progress looks like
// where stderr is no terminal: bare until the host reports byte counts.
var deliveryProgress = regexp.MustCompile(`^delivering template(: \d+\.\d MiB / \d+\.\d MiB \(\d+%\))?$`)

func TestWorkspaceCreateWaitFollowsDelivery(t *testing.T) {
	e := newUpEnv(t)
	_, stderr := e.call(t, "", append([]string{"ws", "create", "--wait", "--label", "test=wait"}, smallWorkspace...)...)
	if !strings.Contains(stderr, "CREATING → AVAILABLE in ") {
		t.Errorf("stderr lacks the transition to AVAILABLE:\n%s", stderr)
	}
	for _, l := range strings.Split(strings.TrimRight(stderr, "\n"), "\n") {
		if strings.HasPrefix(l, "delivering") && !deliveryProgress.MatchString(l) {
			t.Errorf("delivery line %q", l)
		}
	}
	if strings.Contains(stderr, "\r") {
		t.Errorf("stderr is no terminal but has \\r:\n%q", stderr)
	}
	var list ctrlv1.ListWorkspacesResponse
	e.callJSON(t, &list, "ws", "list", "-o", "json")
	if len(list.GetWorkspaces()) != 1 || list.GetWorkspaces()[0].GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Errorf("after create --wait: %v", list.GetWorkspaces())
	}
}

// The real server fails a start only when the host does; this fake
// stands in for a host whose guest never answered.
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

// The real server ends a watch only with an error or at DELETED; this
// fake ends one early, as a server cut off would.
func TestWorkspaceWaitStreamEndsEarly(t *testing.T) {
	e, f := newCtrlEnv(t)
	f.watch = []*ctrlv1.Workspace{testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)}
	_, _, err := e.run(t, "", "ws", "create", "--wait", "--addr", e.addr, "--token", "t")
	if err == nil || !strings.Contains(err.Error(), "ended before") {
		t.Fatalf("err = %v, want the watch to have ended before AVAILABLE", err)
	}
}

// A watch that ends unavailable (the control plane restarts) is watched
// again: the wait goes on to AVAILABLE, rather than failing a create that
// succeeds, which a retry would make twice.
func TestWorkspaceWaitWatchesAgain(t *testing.T) {
	e, f := newCtrlEnv(t)
	creating := testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)
	f.cutWatches = [][]*ctrlv1.Workspace{{creating}, {creating}}
	f.watch = []*ctrlv1.Workspace{creating, testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)}
	if _, stderr, err := e.run(t, "", "ws", "create", "--wait", "--addr", e.addr, "--token", "t"); err != nil {
		t.Fatalf("create --wait across two watches that ended unavailable: %v\n%s", err, stderr)
	}
	calls, _ := f.got()
	if n := strings.Count(strings.Join(calls, ","), "WatchWorkspace"); n != 3 {
		t.Errorf("%d watches, want 3: %v", n, calls)
	}
}

func TestWorkspaceStopModes(t *testing.T) {
	e := newPlacedEnv(t)
	ws := e.createWorkspace(t)
	e.call(t, "", "ws", "stop", ws.GetWorkspaceId())
	e.call(t, "", "ws", "stop", ws.GetWorkspaceId(), "--force")
	var modes []ctrlv1.StopMode
	for _, c := range e.srv.Calls() {
		for _, r := range c.Requests {
			if r, ok := r.(*ctrlv1.StopWorkspaceRequest); ok && r.GetWorkspaceId() == ws.GetWorkspaceId() {
				modes = append(modes, r.GetMode())
			}
		}
	}
	if want := []ctrlv1.StopMode{ctrlv1.StopMode_STOP_MODE_NORMAL, ctrlv1.StopMode_STOP_MODE_FORCE}; !slices.Equal(modes, want) {
		t.Errorf("stop modes sent = %v, want %v (no flag, then --force)", modes, want)
	}
}

func TestWorkspaceStopForceWaits(t *testing.T) {
	e := newUpEnv(t)
	ws := e.createWorkspace(t, append([]string{"--wait"}, smallWorkspace...)...)
	_, stderr := e.call(t, "", "ws", "stop", ws.GetWorkspaceId(), "--force", "--wait")
	if !strings.Contains(stderr, "→ STOPPED in ") {
		t.Errorf("stderr = %q", stderr)
	}
	if got := e.workspace(t, ws.GetWorkspaceId()).GetState(); got != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Errorf("after stop --wait: %v", got)
	}
}

func TestWorkspaceLabelReadsRevision(t *testing.T) {
	e := newPlacedEnv(t)
	ws := e.createWorkspace(t, "--label", "team=ml")
	e.call(t, "", "ws", "label", ws.GetWorkspaceId(), "team=infra")
	calls, _, reqs := e.got()
	if strings.Join(calls, ",") != "GetWorkspace,UpdateWorkspaceLabels" {
		t.Fatalf("calls = %v", calls)
	}
	if r := reqs[1].(*ctrlv1.UpdateWorkspaceLabelsRequest); r.GetExpectedLabelsRevision() != ws.GetLabelsRevision() || r.GetLabels()["team"] != "infra" {
		t.Errorf("request = %v, want labels revision %d", r, ws.GetLabelsRevision())
	}
	if got := e.workspace(t, ws.GetWorkspaceId()).GetLabels(); got["team"] != "infra" {
		t.Errorf("labels = %v", got)
	}
}

// Resources change only while a workspace is STOPPED, so this test needs
// a host that stops it.
func TestWorkspaceMemoryAndDisk(t *testing.T) {
	e := newUpEnv(t)
	ws := e.createWorkspace(t, append([]string{"--wait"}, smallWorkspace...)...)
	id := ws.GetWorkspaceId()
	e.call(t, "", "ws", "stop", id, "--wait")
	before := e.workspace(t, id).GetSpec().GetResourcesRevision()
	e.call(t, "", "ws", "memory", id, "256Mi") // reads the revision first
	after := e.workspace(t, id).GetSpec()
	if after.GetResources().GetMemoryBytes() != 256<<20 || after.GetResourcesRevision() <= before {
		t.Errorf("after ws memory: %v", after)
	}
	stale := strconv.FormatUint(before, 10)
	if _, _, err := e.run(t, "", "ws", "disk", id, "128Mi", "--expected-resources-revision", stale, "--addr", e.addr, "--token", e.token); err == nil {
		t.Error("ws disk with a stale --expected-resources-revision succeeded")
	}
	e.call(t, "", "ws", "disk", id, "128Mi", "--expected-resources-revision", strconv.FormatUint(after.GetResourcesRevision(), 10))
	if got := e.workspace(t, id).GetSpec().GetResources().GetWritableLayerBytes(); got != 128<<20 {
		t.Errorf("writable layer = %d bytes, want 128Mi", got)
	}
}

func TestWorkspaceExpire(t *testing.T) {
	e := newPlacedEnv(t)
	id := e.createWorkspace(t).GetWorkspaceId()
	e.call(t, "", "ws", "expire", id, "--at", "2030-01-02T03:04:05Z", "--action", "delete")
	_, _, reqs := e.got()
	set := reqs[0].(*ctrlv1.UpdateWorkspaceExpirationRequest).GetChange().GetSet()
	if got := set.GetDeadline().AsTime(); !got.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) ||
		set.GetAction() != ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE {
		t.Errorf("set = %v", set)
	}
	if got := e.workspace(t, id).GetExpiration().GetPolicy().GetDeadline().AsTime(); !got.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("stored deadline = %v", got)
	}
	e.call(t, "", "ws", "expire", id, "--clear")
	_, _, reqs = e.got()
	if reqs[0].(*ctrlv1.UpdateWorkspaceExpirationRequest).GetChange().GetClear() == nil {
		t.Errorf("--clear sent %v", reqs[0])
	}
	for _, args := range [][]string{{}, {"--clear", "--action", "stop"}, {"--in", "1h", "--clear"}} {
		if _, _, err := e.run(t, "", append([]string{"ws", "expire", id, "--addr", e.addr, "--token", e.token}, args...)...); err == nil {
			t.Errorf("expire %v succeeded", args)
		}
		if calls, _, _ := e.got(); len(calls) != 0 {
			t.Errorf("expire %v sent %v", args, calls)
		}
	}
}

func TestWorkspaceWatchJSONLines(t *testing.T) {
	e := newUpEnv(t)
	ws := e.createWorkspace(t, append([]string{"--wait"}, smallWorkspace...)...)
	id := ws.GetWorkspaceId()
	e.call(t, "", "ws", "delete", id, "--wait")

	// A deleted Workspace is sent once, and the watch ends.
	stdout, _ := e.call(t, "", "ws", "watch", id, "-o", "json")
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1:\n%s", len(lines), stdout)
	}
	var m ctrlv1.WatchWorkspaceResponse
	if err := protojson.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	if want := e.workspace(t, id); !proto.Equal(m.GetWorkspace(), want) {
		t.Errorf("line = %v, want %v", &m, want)
	}

	stdout, _ = e.call(t, "", "ws", "watch", id)
	lines = strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID ") || strings.Fields(lines[1])[1] != "DELETED" {
		t.Errorf("table watch:\n%s", stdout)
	}
	if strings.Index(lines[0], "STATE") != strings.Index(lines[1], "DELETED") {
		t.Errorf("rows are not aligned with the header:\n%s", stdout)
	}
}

func TestWorkspaceStateCell(t *testing.T) {
	failed := testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED)
	failed.Failure = &ctrlv1.WorkspaceFailure{Reason: ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED}
	if got := stateCell(failed); got != "FAILED(RESOURCE_EXHAUSTED)" {
		t.Errorf("state cell = %q", got)
	}
}

func TestWorkspaceCreateJSON(t *testing.T) {
	e := newPlacedEnv(t)
	ws := e.createWorkspace(t)
	if want := e.workspace(t, ws.GetWorkspaceId()); !proto.Equal(ws, want) {
		t.Errorf("workspace = %v, want %v", ws, want)
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
		got, err := parseSize("--memory", tc.in)
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

// -o wide adds columns to the table; -o yaml prints the response as YAML,
// its keys in the order of the JSON.
func TestWideAndYAMLOutput(t *testing.T) {
	e := newUpEnv(t)
	ws := e.createWorkspace(t, append([]string{"--annotation", "note=x", "--expire-in", "2h"}, smallWorkspace...)...)
	id := ws.GetWorkspaceId()
	stdout, _ := e.call(t, "", "ws", "get", id, "-o", "wide")
	lines := fields(stdout)
	if len(lines) != 2 || !strings.HasSuffix(lines[0], " AGE NETWORK EXPIRES ACTION ANNOTATIONS") {
		t.Fatalf("wide table:\n%s", stdout)
	}
	deadline := ws.GetExpiration().GetPolicy().GetDeadline().AsTime().UTC().Format(time.RFC3339)
	if want := " DENY_ALL " + deadline + " STOP note=x"; !strings.HasSuffix(lines[1], want) {
		t.Errorf("wide row %q does not end with %q", lines[1], want)
	}

	stdout, _ = e.call(t, "", "ws", "get", id, "-o", "yaml")
	var doc struct {
		Workspace struct {
			WorkspaceID string            `yaml:"workspaceId"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"workspace"`
	}
	if err := yaml.Unmarshal([]byte(stdout), &doc); err != nil || doc.Workspace.WorkspaceID != id || doc.Workspace.Annotations["note"] != "x" {
		t.Fatalf("yaml: %+v, %v\n%s", doc, err, stdout)
	}
	if !strings.HasPrefix(stdout, "workspace:\n  workspaceId: "+id+"\n") {
		t.Errorf("yaml is not in block style, in the order of the JSON:\n%s", stdout)
	}
	if _, _, err := e.run(t, "", "ws", "get", id, "-o", "xml", "--addr", e.addr, "--token", e.token); err == nil || !strings.Contains(err.Error(), "want table, wide, json or yaml") {
		t.Errorf("-o xml: %v", err)
	}
}

func TestDescribe(t *testing.T) {
	e := newUpEnv(t)
	ws := e.createWorkspace(t, append([]string{"--wait", "--label", "team=ml", "--annotation", "note=x", "--expire-in", "2h", "--expire-action", "stop"}, smallWorkspace...)...)
	id := ws.GetWorkspaceId()
	stdout, _ := e.call(t, "", "ws", "describe", id)
	got := strings.Join(fields(stdout), "\n")
	deadline := ws.GetExpiration().GetPolicy().GetDeadline().AsTime().UTC().Format(time.RFC3339)
	for _, want := range []string{
		"ID " + id, "STATE AVAILABLE", "LABELS team=ml", "ANNOTATIONS note=x",
		"EXPIRES " + deadline + " (STOP)", "CREATED " + ws.GetCreatedAt().AsTime().UTC().Format(time.RFC3339) + " (",
		"NETWORK", "MODE DENY_ALL",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("describe lacks %q:\n%s", want, got)
		}
	}
	var resp ctrlv1.GetWorkspaceResponse
	e.callJSON(t, &resp, "ws", "describe", id, "-o", "json")
	if resp.GetWorkspace().GetWorkspaceId() != id {
		t.Errorf("describe -o json: %v", &resp)
	}
	if _, _, err := e.run(t, "", "ws", "describe", "ws_06h38fjb8dr6d00n3d7fkxjf2m", "--addr", e.addr, "--token", e.token); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("describe of a missing workspace: %v", err)
	}
}

// TestDiskCell: the DISK column shows the layer as asked for, or, for the
// host's default, the capacity the layer has once it exists.
func TestDiskCell(t *testing.T) {
	gib := uint64(1 << 30)
	tier := &ctrlv1.RetentionTier{Kind: ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT, CapacityBytes: &gib}
	for want, ws := range map[string]*ctrlv1.Workspace{
		"64Mi":    {Spec: &ctrlv1.WorkspaceSpec{Resources: &ctrlv1.ResourceRequest{WritableLayerBytes: 64 << 20}}, RetentionTiers: []*ctrlv1.RetentionTier{tier}},
		"1Gi":     {Spec: &ctrlv1.WorkspaceSpec{Resources: &ctrlv1.ResourceRequest{}}, RetentionTiers: []*ctrlv1.RetentionTier{tier}},
		"default": {Spec: &ctrlv1.WorkspaceSpec{Resources: &ctrlv1.ResourceRequest{}}},
	} {
		if got := diskCell(ws); got != want {
			t.Errorf("diskCell = %q, want %q", got, want)
		}
	}
}

// TestAnnotationCell: a table shows each annotation's value cut short; the
// whole is for -o json.
func TestAnnotationCell(t *testing.T) {
	long := strings.Repeat("é", 200)
	if got, want := annotationCell(map[string]string{"b": long, "a": "short"}), "a=short,b="+strings.Repeat("é", maxAnnotationCell)+"…"; got != want {
		t.Errorf("annotationCell = %q, want %q", got, want)
	}
	if got := annotationCell(nil); got != "-" {
		t.Errorf("annotationCell(nil) = %q", got)
	}
}
