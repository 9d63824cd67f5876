package sessions_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/sessions"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates/templatetest"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces/workspacestest"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/callertest"
	"github.com/kibotos/kibotos/sdk/sessiontoken"
)

// These tests drive SessionService through Connect over a real SQLite
// store, with workspaces moved by simulated host reports.

const endpoint = "http://127.0.0.1:8870"

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type env struct {
	t      *testing.T
	ctx    context.Context // the caller of project p1
	ws     *workspaces.Service
	host   *workspacestest.Host
	svc    *sessions.Service
	clock  *clock
	client ctrlv1connect.SessionServiceClient // project p1
	other  ctrlv1connect.SessionServiceClient // project p2
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st := testutil.SQLiteStore(t)
	ctx := context.Background()
	clk := &clock{now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	templatetest.Seed(t, st, clk.Now(), "p1", "p2")
	ws := &workspaces.Service{Store: st, Pages: pagetoken.New([]byte("k")), Checker: &netcheck.Checker{},
		Changes: changes.NewBroker(), Now: clk.Now}
	host := workspacestest.Register(t, ctx, ws, endpoint, "")
	svc := &sessions.Service{Store: st, Workspaces: ws, Now: clk.Now}

	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewSessionServiceHandler(api.NewSessionService(svc), callertest.Handler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client := func(project string) ctrlv1connect.SessionServiceClient {
		return ctrlv1connect.NewSessionServiceClient(srv.Client(), srv.URL, callertest.Client(project))
	}
	return &env{t: t, ctx: auth.WithCaller(ctx, auth.Caller{ProjectID: "p1", Role: auth.Editor}), ws: ws, host: host, svc: svc,
		clock: clk, client: client("p1"), other: client("p2")}
}

func write[R proto.Message](method string, newR func() R) workspaces.Write[R] {
	return workspaces.Write[R]{Method: method, Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
		Input: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, New: newR}
}

func identity(ws *ctrlv1.Workspace) *ctrlv1.Workspace { return ws }
func newWS() *ctrlv1.Workspace                        { return new(ctrlv1.Workspace) }

// create creates a workspace; running also makes it AVAILABLE.
func (e *env) create(running bool) string {
	e.t.Helper()
	ws, err := workspaces.Create(e.ctx, e.ws, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 256 << 20}}, nil, nil, identity)
	if err != nil {
		e.t.Fatal(err)
	}
	if running {
		e.report(ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	}
	return ws.WorkspaceId
}

// report sends a host report for the workspace's current execution.
func (e *env) report(id string, state hostv1.ObservedState) *ctrlv1.Workspace {
	e.t.Helper()
	e.host.Report(id, state)
	ws, err := e.ws.Get(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return ws
}

// check verifies a token as the host running its workspace would.
func (e *env) check(id, tok string) error {
	e.t.Helper()
	parsed, err := sessiontoken.Parse(tok)
	if err != nil {
		return err
	}
	a := e.host.Assignment(id)
	return parsed.Verify(sessiontoken.Authority{WorkspaceID: a.WorkspaceId, Generation: a.Generation,
		Key: a.GetDataPlane().GetKey(), Revoked: a.GetDataPlane().GetRevokedSessionIds()}, e.clock.Now())
}

func (e *env) issue(id string, ttl uint32) *ctrlv1.IssueSessionResponse {
	e.t.Helper()
	resp, err := e.client.IssueSession(context.Background(), connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: id, TtlSeconds: ttl}))
	if err != nil {
		e.t.Fatalf("IssueSession: %v", err)
	}
	return resp.Msg
}

func (e *env) revoke(sessionID string) error {
	_, err := e.client.RevokeSession(context.Background(), connect.NewRequest(&ctrlv1.RevokeSessionRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, SessionId: sessionID}))
	return err
}

func TestIssueSession(t *testing.T) {
	e := newEnv(t)
	id := e.create(false)
	// The key rides on the first assignment: the host holds it before the
	// workspace is AVAILABLE, so a session issued at once is accepted.
	first := e.host.Assignment(id).GetDataPlane().GetKey()
	if len(first) != sessiontoken.KeySize {
		t.Errorf("a CREATING workspace's assignment carries key %x", first)
	}
	_, err := e.client.IssueSession(context.Background(), connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: id}))
	testutil.WantCode(t, "issue for CREATING", err, connect.CodeFailedPrecondition)
	if d := testutil.ErrorDetail(err); d.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_ISSUING_SESSION ||
		d.GetObservedWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING {
		t.Errorf("issue for CREATING: detail %v", d)
	}

	e.report(id, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	if k := e.host.Assignment(id).GetDataPlane().GetKey(); !bytes.Equal(k, first) {
		t.Fatalf("the key changed when the workspace became AVAILABLE: %x, was %x", k, first)
	}
	s := e.issue(id, 0)
	if !strings.HasPrefix(s.SessionId, "ses_") || s.Endpoint != endpoint ||
		!s.ExpiresAt.AsTime().Equal(e.clock.Now().Add(time.Hour)) {
		t.Errorf("issued %v", s)
	}
	if err := e.check(id, s.Token); err != nil {
		t.Errorf("issued token: %v", err)
	}
	e.clock.Advance(time.Hour)
	if err := e.check(id, s.Token); !errors.Is(err, sessiontoken.ErrExpired) {
		t.Errorf("token after its ttl: %v", err)
	}
	if long := e.issue(id, 86400); !long.ExpiresAt.AsTime().Equal(e.clock.Now().Add(24 * time.Hour)) {
		t.Errorf("ttl 86400: expires %v", long.ExpiresAt.AsTime())
	}

	for name, req := range map[string]*ctrlv1.IssueSessionRequest{
		"ttl above the maximum": {WorkspaceId: id, TtlSeconds: 86401},
		"no workspace":          {},
	} {
		_, err := e.client.IssueSession(context.Background(), connect.NewRequest(req))
		testutil.WantCode(t, name, err, connect.CodeInvalidArgument)
	}
	_, err = e.client.IssueSession(context.Background(), connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: "ws_unknown"}))
	testutil.WantCode(t, "unknown workspace", err, connect.CodeNotFound)
	_, err = e.other.IssueSession(context.Background(), connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: id}))
	testutil.WantCode(t, "another project's workspace", err, connect.CodeNotFound)

	if _, err := workspaces.Stop(e.ctx, e.ws, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.IssueSession(context.Background(), connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: id}))
	testutil.WantCode(t, "issue for STOPPING", err, connect.CodeFailedPrecondition)
	// While it stops, the host still tells the calls it admitted from
	// forged ones (it refuses new calls itself, the execution being not
	// wanted running); once stopped, no token verifies there.
	if a := e.host.Assignment(id); a.DataPlane == nil {
		t.Error("a stopping execution's assignment carries no data plane: the calls in flight would be cut")
	}
	e.report(id, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
	if a := e.host.Assignment(id); a.GetDataPlane() != nil {
		t.Errorf("a stopped execution's assignment carries a data plane: %v", a.DataPlane)
	}
}

func TestRevokeSession(t *testing.T) {
	e := newEnv(t)
	id := e.create(true)
	s1, s2 := e.issue(id, 0), e.issue(id, 0)

	changed := e.ws.Changes.Changed()
	if err := e.revoke(s1.SessionId); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("a revocation did not wake the host streams")
	}
	if got := e.host.Assignment(id).GetDataPlane().GetRevokedSessionIds(); len(got) != 1 || got[0] != s1.SessionId {
		t.Errorf("revoked ids = %v", got)
	}
	if err := e.check(id, s1.Token); !errors.Is(err, sessiontoken.ErrRevoked) {
		t.Errorf("revoked token: %v", err)
	}
	if err := e.check(id, s2.Token); err != nil {
		t.Errorf("other token: %v", err)
	}
	if err := e.revoke(s1.SessionId); err != nil {
		t.Errorf("revoking again: %v", err)
	}
	if got := e.host.Assignment(id).GetDataPlane().GetRevokedSessionIds(); len(got) != 1 {
		t.Errorf("revoked ids after revoking again = %v", got)
	}

	// A command replays; its ID with another input is a conflict.
	cmd := &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}
	for range 2 {
		if _, err := e.client.RevokeSession(context.Background(), connect.NewRequest(&ctrlv1.RevokeSessionRequest{Command: cmd, SessionId: s2.SessionId})); err != nil {
			t.Errorf("revoke (replayed): %v", err)
		}
	}
	_, err := e.client.RevokeSession(context.Background(), connect.NewRequest(&ctrlv1.RevokeSessionRequest{Command: cmd, SessionId: s1.SessionId}))
	testutil.WantCode(t, "command reused", err, connect.CodeAlreadyExists)
	_, err = e.client.RevokeSession(context.Background(), connect.NewRequest(&ctrlv1.RevokeSessionRequest{SessionId: s1.SessionId}))
	testutil.WantCode(t, "no command", err, connect.CodeInvalidArgument)
	testutil.WantCode(t, "no session", e.revoke(""), connect.CodeInvalidArgument)
	testutil.WantCode(t, "unknown session", e.revoke("ses_unknown"), connect.CodeNotFound)
	_, err = e.other.RevokeSession(context.Background(), connect.NewRequest(&ctrlv1.RevokeSessionRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, SessionId: s1.SessionId}))
	testutil.WantCode(t, "another project's session", err, connect.CodeNotFound)

	// Expired sessions: revoking one succeeds and lists nothing once its
	// expiry is past a grace for the hosts' clock skew; a listed one
	// leaves the list then.
	short := e.issue(id, 60)
	e.clock.Advance(60*time.Second + workspaces.RevokedGrace)
	if err := e.revoke(short.SessionId); err != nil {
		t.Errorf("revoking an expired session: %v", err)
	}
	if got := e.host.Assignment(id).GetDataPlane().GetRevokedSessionIds(); len(got) != 2 {
		t.Errorf("revoked ids = %v, want s1 and s2", got)
	}
	e.clock.Advance(time.Hour)
	if got := e.host.Assignment(id).GetDataPlane().GetRevokedSessionIds(); len(got) != 0 {
		t.Errorf("expired sessions still listed: %v", got)
	}

	// The index forgets sessions long expired.
	e.clock.Advance(sessions.Retention)
	if n, err := e.svc.Prune(context.Background()); err != nil || n != 3 {
		t.Errorf("Prune = %d, %v; want 3", n, err)
	}
	testutil.WantCode(t, "revoking a forgotten session", e.revoke(s1.SessionId), connect.CodeNotFound)
}

func TestRotateDataPlane(t *testing.T) {
	e := newEnv(t)
	id := e.create(true)
	s1, s2 := e.issue(id, 0), e.issue(id, 0)
	if err := e.revoke(s1.SessionId); err != nil {
		t.Fatal(err)
	}
	before := e.host.Assignment(id).DataPlane

	rotate := func(client ctrlv1connect.SessionServiceClient, id string) (*ctrlv1.Workspace, error) {
		resp, err := client.RotateDataPlane(context.Background(), connect.NewRequest(&ctrlv1.RotateDataPlaneRequest{
			Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, WorkspaceId: id}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.GetWorkspace(), nil
	}
	ws, err := rotate(e.client, id)
	if err != nil || ws.GetWorkspaceId() != id || ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("rotate: %v, %v", ws, err)
	}
	after := e.host.Assignment(id).DataPlane
	if len(after.GetKey()) != sessiontoken.KeySize || proto.Equal(before, after) || len(after.RevokedSessionIds) != 0 {
		t.Errorf("data plane %v after rotation, %v before", after, before)
	}
	for _, s := range []*ctrlv1.IssueSessionResponse{s1, s2} {
		if err := e.check(id, s.Token); !errors.Is(err, sessiontoken.ErrInvalid) {
			t.Errorf("token issued before the rotation: %v", err)
		}
	}
	if err := e.check(id, e.issue(id, 0).Token); err != nil {
		t.Errorf("token issued after the rotation: %v", err)
	}

	_, err = rotate(e.other, id)
	testutil.WantCode(t, "another project's workspace", err, connect.CodeNotFound)
	_, err = rotate(e.client, "")
	testutil.WantCode(t, "no workspace", err, connect.CodeInvalidArgument)

	// A stopped workspace can rotate; a deleting one cannot.
	other := e.create(false)
	if _, err := rotate(e.client, other); err != nil {
		t.Errorf("rotate a CREATING workspace: %v", err)
	}
	if _, err := workspaces.Delete(e.ctx, e.ws, write("delete", newWS), other, identity); err != nil {
		t.Fatal(err)
	}
	_, err = rotate(e.client, other)
	testutil.WantCode(t, "rotate a DELETING workspace", err, connect.CodeFailedPrecondition)
	if d := testutil.ErrorDetail(err); d.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_ROTATING_DATA_PLANE {
		t.Errorf("rotate a DELETING workspace: detail %v", d)
	}
}

func TestSessionsEndWithTheirGeneration(t *testing.T) {
	e := newEnv(t)
	id := e.create(true)
	s1, s2 := e.issue(id, 0), e.issue(id, 0)
	if err := e.revoke(s1.SessionId); err != nil {
		t.Fatal(err)
	}
	if _, err := workspaces.Stop(e.ctx, e.ws, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	e.report(id, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
	// Revoking a session of a stopped execution succeeds.
	if err := e.revoke(s2.SessionId); err != nil {
		t.Errorf("revoke while stopped: %v", err)
	}
	if _, err := workspaces.Start(e.ctx, e.ws, write("start", newWS), id, identity); err != nil {
		t.Fatal(err)
	}
	if ws := e.report(id, hostv1.ObservedState_OBSERVED_STATE_RUNNING); ws.Generation != 2 {
		t.Fatalf("generation %d after the second start", ws.Generation)
	}
	a := e.host.Assignment(id)
	if a.Generation != 2 || len(a.GetDataPlane().GetKey()) != sessiontoken.KeySize || len(a.GetDataPlane().GetRevokedSessionIds()) != 0 {
		t.Errorf("assignment of generation 2: %v", a)
	}
	for _, s := range []*ctrlv1.IssueSessionResponse{s1, s2} {
		if err := e.check(id, s.Token); !errors.Is(err, sessiontoken.ErrInvalid) {
			t.Errorf("token of generation 1 after the next start: %v", err)
		}
	}
	if err := e.check(id, e.issue(id, 0).Token); err != nil {
		t.Errorf("token of generation 2: %v", err)
	}
}

// TestRevokeIssuedBy revokes the sessions an API token issued, and those
// of its project no token is recorded for, and only those; a workspace whose list of revocations is full gets a new key
// instead, which ends all of its sessions.
func TestRevokeIssuedBy(t *testing.T) {
	e := newEnv(t)
	id := e.create(true)
	as := func(token string) context.Context {
		return auth.WithCaller(context.Background(), auth.Caller{ProjectID: "p1", TokenID: token, Role: auth.Editor})
	}
	err := e.svc.Store.Update(context.Background(), func(tx store.Tx) error {
		for _, id := range []string{"tok_a", "tok_b"} {
			if err := tx.CreateToken(context.Background(), store.Token{ID: id, ProjectID: "p1", Role: string(auth.Editor), CreatedAt: e.clock.Now()}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(token string) *ctrlv1.IssueSessionResponse {
		resp, err := e.svc.Issue(as(token), id, 0)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	a1, a2, b := issue("tok_a"), issue("tok_a"), issue("tok_b")
	// One issued before tokens were recorded: any token's revocation in
	// its project ends it.
	legacy := issue("")
	err = e.svc.Store.Update(context.Background(), func(tx store.Tx) error { return tx.RevokeToken(context.Background(), "tok_a", e.clock.Now()) })
	if err != nil {
		t.Fatal(err)
	}
	if err := e.svc.RevokeIssuedBy(context.Background(), "p1", "tok_a"); err != nil {
		t.Fatal(err)
	}
	// A call of the revoked token that was authenticated before (another
	// replica's cache of callers) issues no session, which would
	// outlive the sweep.
	if _, err := e.svc.Issue(as("tok_a"), id, 0); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a session issued to a revoked token: %v", err)
	}
	for _, s := range []*ctrlv1.IssueSessionResponse{a1, a2, legacy} {
		if err := e.check(id, s.Token); !errors.Is(err, sessiontoken.ErrRevoked) {
			t.Errorf("a session of the revoked token: %v", err)
		}
	}
	if err := e.check(id, b.Token); err != nil {
		t.Errorf("a session of another token: %v", err)
	}
	if err := e.svc.RevokeIssuedBy(context.Background(), "p1", "tok_a"); err != nil {
		t.Errorf("again: %v", err)
	}

	// More sessions than a workspace lists: its key is replaced.
	err = e.svc.Store.Update(context.Background(), func(tx store.Tx) error {
		for i := range sessions.MaxRevoked {
			if err := tx.CreateSession(context.Background(), store.Session{ProjectID: "p1", ID: fmt.Sprintf("ses_many%04d", i), WorkspaceID: id,
				Generation: 1, ExpiresAt: e.clock.Now().Add(time.Hour), CreatedAt: e.clock.Now(), TokenID: "tok_b"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	before := e.host.Assignment(id).GetDataPlane().GetKey()
	if err := e.svc.RevokeIssuedBy(context.Background(), "p1", "tok_b"); err != nil {
		t.Fatal(err)
	}
	if dp := e.host.Assignment(id).GetDataPlane(); bytes.Equal(dp.GetKey(), before) || len(dp.GetRevokedSessionIds()) != 0 {
		t.Errorf("the workspace kept its key (%v) or listed %d revocations", bytes.Equal(dp.GetKey(), before), len(dp.GetRevokedSessionIds()))
	}
	if err := e.check(id, b.Token); err == nil {
		t.Error("a session of the revoked token still works after the rotation")
	}
}
