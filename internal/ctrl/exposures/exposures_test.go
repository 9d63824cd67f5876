package exposures_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/api"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/exposures"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlite"
	"github.com/kibotos/kibotos/internal/ctrl/templates/templatetest"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces/workspacestest"
	"github.com/kibotos/kibotos/internal/exposureabi"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/callertest"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
)

// These tests drive ExposureService through Connect over a real SQLite
// store, with workspaces moved by simulated host reports; the host's side
// of an exposure is checked in internal/host/agent and end to end in
// internal/daemon.

const endpoint = "http://127.0.0.1:8870"

type env struct {
	t      *testing.T
	ctx    context.Context // the caller of project p1
	dbPath string
	ws     *workspaces.Service
	host   *workspacestest.Host
	client ctrlv1connect.ExposureServiceClient // project p1
	other  ctrlv1connect.ExposureServiceClient // project p2
}

// newEnv serves ExposureService for a host h1 registered with domain as
// its exposure domain.
func newEnv(t *testing.T, domain string) *env {
	t.Helper()
	ctx := context.Background()
	dbPath := filepath.Join(t.TempDir(), "kibotos.db")
	st, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	templatetest.Seed(t, st, now, "p1", "p2")
	pages := pagetoken.New([]byte("k"))
	ws := &workspaces.Service{Store: st, Pages: pages, Checker: &netcheck.Checker{}, Changes: changes.NewBroker()}
	host := workspacestest.Register(t, ctx, ws, endpoint, domain)
	svc := &exposures.Service{Store: st, Workspaces: ws, Pages: pages}
	ws.Exposures = svc

	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewExposureServiceHandler(api.NewExposureService(svc), callertest.Handler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client := func(project string) ctrlv1connect.ExposureServiceClient {
		return ctrlv1connect.NewExposureServiceClient(srv.Client(), srv.URL, callertest.Client(project))
	}
	return &env{t: t, ctx: auth.WithCaller(ctx, auth.Caller{ProjectID: "p1", Role: auth.Editor}), dbPath: dbPath, ws: ws, host: host,
		client: client("p1"), other: client("p2")}
}

func write[R proto.Message](newR func() R) workspaces.Write[R] {
	return workspaces.Write[R]{Method: "test", Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
		Input: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, New: newR}
}

func identity(ws *ctrlv1.Workspace) *ctrlv1.Workspace { return ws }
func newWS() *ctrlv1.Workspace                        { return new(ctrlv1.Workspace) }

// create creates an AVAILABLE workspace.
func (e *env) create() string {
	e.t.Helper()
	ws, err := workspaces.Create(e.ctx, e.ws, write(newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 256 << 20}}, nil, nil, identity)
	if err != nil {
		e.t.Fatal(err)
	}
	e.host.Report(ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	return ws.WorkspaceId
}

// stop stops a workspace until STOPPED; start starts it until AVAILABLE.
func (e *env) stop(id string) {
	e.t.Helper()
	if _, err := workspaces.Stop(e.ctx, e.ws, write(newWS), id, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		e.t.Fatal(err)
	}
	e.host.Report(id, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
}

func (e *env) start(id string) {
	e.t.Helper()
	if _, err := workspaces.Start(e.ctx, e.ws, write(newWS), id, identity); err != nil {
		e.t.Fatal(err)
	}
	e.host.Report(id, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
}

// routed returns the IDs of the exposures the host routes to the
// workspace's execution.
func (e *env) routed(id string) []string {
	var out []string
	for _, x := range e.host.Assignment(id).Exposures {
		out = append(out, x.ExposureId)
	}
	return out
}

func (e *env) expose(req *ctrlv1.CreateExposureRequest) (*ctrlv1.Exposure, error) {
	if req.Command == nil {
		req.Command = &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}
	}
	resp, err := e.client.CreateExposure(context.Background(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Exposure, nil
}

func (e *env) mustExpose(req *ctrlv1.CreateExposureRequest) *ctrlv1.Exposure {
	e.t.Helper()
	x, err := e.expose(req)
	if err != nil {
		e.t.Fatalf("CreateExposure: %v", err)
	}
	return x
}

func (e *env) list(workspaceID string) []string {
	e.t.Helper()
	resp, err := e.client.ListExposures(context.Background(), connect.NewRequest(&ctrlv1.ListExposuresRequest{WorkspaceId: workspaceID}))
	if err != nil {
		e.t.Fatalf("ListExposures: %v", err)
	}
	var out []string
	for _, x := range resp.Msg.Exposures {
		if x.Token != "" {
			e.t.Errorf("ListExposures returned the token of %s", x.ExposureId)
		}
		out = append(out, x.ExposureId)
	}
	return out
}

func (e *env) revoke(client ctrlv1connect.ExposureServiceClient, id string) error {
	_, err := client.RevokeExposure(context.Background(), connect.NewRequest(&ctrlv1.RevokeExposureRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, ExposureId: id}))
	return err
}

func TestCreateExposure(t *testing.T) {
	e := newEnv(t, "")
	id := e.create()
	cmd := &ctrlv1.CommandMetadata{CommandId: "expose-8080"}
	x := e.mustExpose(&ctrlv1.CreateExposureRequest{Command: cmd, WorkspaceId: id, Port: 8080})
	if !strings.HasPrefix(x.ExposureId, "exp_") || x.WorkspaceId != id || x.Port != 8080 ||
		x.Auth != ctrlv1.ExposureAuth_EXPOSURE_AUTH_TOKEN || x.Persistent || x.CreatedAt == nil ||
		x.Url != endpoint+"/x/"+x.ExposureId+"/" || !strings.HasPrefix(x.Token, x.ExposureId+".") {
		t.Fatalf("created %v", x)
	}
	// The host gets the hash, which the token verifies against; the store
	// keeps neither the token nor its secret.
	routed := e.host.Assignment(id).Exposures
	if len(routed) != 1 || routed[0].ExposureId != x.ExposureId || routed[0].Port != 8080 ||
		!exposureabi.Verify(x.Token, x.ExposureId, routed[0].TokenSha256) {
		t.Fatalf("assignment's exposures %v do not admit the token", routed)
	}
	_, secret, _ := strings.Cut(x.Token, ".")
	if dump := fmt.Sprint(ctrltest.SnapshotSQLite(t, e.dbPath)); strings.Contains(dump, secret) {
		t.Error("the store holds the token's secret")
	}
	// A replay returns the same exposure without its token; the same
	// command with other input is a conflict.
	again := e.mustExpose(&ctrlv1.CreateExposureRequest{Command: cmd, WorkspaceId: id, Port: 8080})
	if again.Token != "" || again.ExposureId != x.ExposureId || again.Url != x.Url {
		t.Errorf("replay returned %v", again)
	}
	_, err := e.expose(&ctrlv1.CreateExposureRequest{Command: cmd, WorkspaceId: id, Port: 8081})
	testutil.WantCode(t, "same command, another port", err, connect.CodeAlreadyExists)

	// PUBLIC has no token, and nothing for the host to check.
	pub := e.mustExpose(&ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 3000, Auth: ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC})
	if pub.Token != "" || pub.Auth != ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC {
		t.Errorf("PUBLIC exposure %v", pub)
	}
	for _, a := range e.host.Assignment(id).Exposures {
		if a.ExposureId == pub.ExposureId && (a.Auth != ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC || len(a.TokenSha256) != 0) {
			t.Errorf("PUBLIC assignment %v", a)
		}
	}
	if got := e.list(id); len(got) != 2 || got[0] != x.ExposureId || got[1] != pub.ExposureId {
		t.Errorf("listed %v", got)
	}
}

func TestCreateExposureRefusals(t *testing.T) {
	e := newEnv(t, "")
	id := e.create()
	stopped := e.create()
	e.stop(stopped)
	theirs, err := workspaces.Create(auth.WithCaller(context.Background(), auth.Caller{ProjectID: "p2", Role: auth.Editor}),
		e.ws, write(newWS), &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 256 << 20}}, nil, nil, identity)
	if err != nil {
		t.Fatal(err)
	}
	e.mustExpose(&ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 8080})
	before := ctrltest.SnapshotSQLite(t, e.dbPath)
	for _, c := range []struct {
		name string
		req  *ctrlv1.CreateExposureRequest
		code connect.Code
	}{
		{"port 0", &ctrlv1.CreateExposureRequest{WorkspaceId: id}, connect.CodeInvalidArgument},
		{"port 65536", &ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 65536}, connect.CodeInvalidArgument},
		{"unknown auth", &ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 1, Auth: 9}, connect.CodeInvalidArgument},
		{"no workspace", &ctrlv1.CreateExposureRequest{Port: 1}, connect.CodeInvalidArgument},
		{"no command", &ctrlv1.CreateExposureRequest{Command: &ctrlv1.CommandMetadata{}, WorkspaceId: id, Port: 1}, connect.CodeInvalidArgument},
		{"unknown workspace", &ctrlv1.CreateExposureRequest{WorkspaceId: "ws_nope", Port: 1}, connect.CodeNotFound},
		{"another project's workspace", &ctrlv1.CreateExposureRequest{WorkspaceId: theirs.WorkspaceId, Port: 1}, connect.CodeNotFound},
		{"stopped workspace", &ctrlv1.CreateExposureRequest{WorkspaceId: stopped, Port: 1}, connect.CodeFailedPrecondition},
		{"port already exposed", &ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 8080, Auth: ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC}, connect.CodeAlreadyExists},
	} {
		_, err := e.expose(c.req)
		testutil.WantCode(t, c.name, err, c.code)
		if c.code == connect.CodeFailedPrecondition {
			if d := testutil.ErrorDetail(err); d.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_CREATING_EXPOSURE ||
				d.GetObservedWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
				t.Errorf("%s: detail %v", c.name, d)
			}
		}
	}
	if after := ctrltest.SnapshotSQLite(t, e.dbPath); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Error("a refused CreateExposure stored something")
	}
	_, err = e.client.ListExposures(context.Background(), connect.NewRequest(&ctrlv1.ListExposuresRequest{WorkspaceId: theirs.WorkspaceId}))
	testutil.WantCode(t, "list another project's workspace", err, connect.CodeNotFound)
}

func TestExposuresEndWithTheExecution(t *testing.T) {
	e := newEnv(t, "")
	id := e.create()
	plain := e.mustExpose(&ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 8080})
	kept := e.mustExpose(&ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 9090, Persistent: true})
	e.stop(id)
	if got := e.routed(id); len(got) != 0 {
		t.Errorf("a stopped workspace's host routes %v", got)
	}
	if got := e.list(id); len(got) != 1 || got[0] != kept.ExposureId {
		t.Errorf("after the stop: %v, want only the persistent %s", got, kept.ExposureId)
	}
	e.start(id)
	if got := e.routed(id); len(got) != 1 || got[0] != kept.ExposureId {
		t.Errorf("after the start the host routes %v, want %s", got, kept.ExposureId)
	}
	// The ended exposure's port is free again; revoking it still succeeds.
	e.mustExpose(&ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 8080})
	if err := e.revoke(e.client, plain.ExposureId); err != nil {
		t.Errorf("revoking an exposure that ended with its execution: %v", err)
	}
	if _, err := workspaces.Delete(e.ctx, e.ws, write(newWS), id, identity); err != nil {
		t.Fatal(err)
	}
	if got := e.list(id); len(got) != 0 {
		t.Errorf("a deleting workspace keeps exposures %v", got)
	}
}

func TestRevokeExposure(t *testing.T) {
	e := newEnv(t, "")
	id := e.create()
	x := e.mustExpose(&ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: 8080})
	testutil.WantCode(t, "revoke by another project", e.revoke(e.other, x.ExposureId), connect.CodeNotFound)
	if got := e.routed(id); len(got) != 1 {
		t.Fatalf("another project's revoke changed the routes: %v", got)
	}
	changed := e.ws.Changes.Changed()
	if err := e.revoke(e.client, x.ExposureId); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("RevokeExposure woke no assignment stream")
	}
	if got := e.routed(id); len(got) != 0 {
		t.Errorf("revoked, the host still routes %v", got)
	}
	if got := e.list(id); len(got) != 0 {
		t.Errorf("revoked, listed %v", got)
	}
	if err := e.revoke(e.client, x.ExposureId); err != nil {
		t.Errorf("revoking again: %v", err)
	}
	testutil.WantCode(t, "revoke unknown", e.revoke(e.client, "exp_nope"), connect.CodeNotFound)
	testutil.WantCode(t, "revoke without ID", e.revoke(e.client, ""), connect.CodeInvalidArgument)
}

func TestListExposuresPages(t *testing.T) {
	e := newEnv(t, "apps.example.test")
	id, other := e.create(), e.create()
	var want []string
	for port := uint32(1); port <= 5; port++ {
		x := e.mustExpose(&ctrlv1.CreateExposureRequest{WorkspaceId: id, Port: port})
		if u := "http://" + exposureabi.HostLabel(port, id) + ".apps.example.test:8870/"; x.Url != u {
			t.Errorf("url %s, want %s", x.Url, u)
		}
		want = append(want, x.ExposureId)
	}
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		resp, err := e.client.ListExposures(context.Background(), connect.NewRequest(&ctrlv1.ListExposuresRequest{
			WorkspaceId: id, PageSize: 2, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range resp.Msg.Exposures {
			got = append(got, x.ExposureId)
		}
		if token = resp.Msg.NextPageToken; token == "" || pages > 5 {
			break
		}
		// A token is only valid for its workspace.
		_, err = e.client.ListExposures(context.Background(), connect.NewRequest(&ctrlv1.ListExposuresRequest{
			WorkspaceId: other, PageSize: 2, PageToken: token}))
		testutil.WantCode(t, "page token of another workspace", err, connect.CodeInvalidArgument)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pages gave %v, want %v", got, want)
	}
	for name, req := range map[string]*ctrlv1.ListExposuresRequest{
		"no workspace":        {},
		"page size too large": {WorkspaceId: id, PageSize: 1001},
	} {
		_, err := e.client.ListExposures(context.Background(), connect.NewRequest(req))
		testutil.WantCode(t, name, err, connect.CodeInvalidArgument)
	}
}
