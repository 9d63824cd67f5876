package workspaces

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates/templatetest"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk/sessiontoken"
)

// clock is a test clock that moves only when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) get() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (s *Service) hostState(t *testing.T, id string) HostView {
	t.Helper()
	hosts, err := s.ListHosts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		if h.ID == id {
			return h
		}
	}
	t.Fatalf("host %s is not listed", id)
	return HostView{}
}

// newLeaseService is newService on a test clock, with h1 registered on
// that clock and a workspace AVAILABLE on it.
func newLeaseService(t *testing.T) (*Service, context.Context, *clock, string) {
	t.Helper()
	s, ctx := newService(t)
	c := &clock{now: time.Now()}
	s.Now = c.get
	// h1 registered on the real clock; register it again on the test's.
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	id := create(t, s, ctx, 512<<20).WorkspaceId
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	return s, ctx, c, id
}

// TestHostLease: a host silent for the lease is LOST and its workspace
// UNKNOWN; it is not started, expired or placed on; its return makes the
// workspace AVAILABLE again; a NORMAL stop waits for it, a FORCE stop
// releases the workspace (UNCONFIRMED) and a report of the released
// execution moves nothing; a start on another host follows.
func TestHostLease(t *testing.T) {
	s, ctx, c, id := newLeaseService(t)

	lose := func(want ctrlv1.WorkspaceState) {
		t.Helper()
		c.add(s.Lease())
		if err := s.ExpireLeases(ctx); err != nil {
			t.Fatal(err)
		}
		if ws, _ := s.Get(ctx, id); ws.GetState() != want || !s.hostState(t, "h1").Lost {
			t.Fatalf("after the lease: %v, host %+v; want %v on a LOST host", ws.GetState(), s.hostState(t, "h1"), want)
		}
	}
	c.add(s.Lease() - time.Second)
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if ws, _ := s.Get(ctx, id); ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("within the lease: %v", ws.GetState())
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil) // renews it
	lose(ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN)
	if err := s.ExpireLeases(ctx); err != nil { // again: nothing more changes
		t.Fatal(err)
	}

	// Nothing is admitted on a LOST host.
	if _, err := Start(ctx, s, write("start", newWS), id, identity); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("start of an UNKNOWN workspace: %v", err)
	}
	if _, err := Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20}}, nil, nil, identity); connect.CodeOf(err) != connect.CodeResourceExhausted ||
		!strings.Contains(err.Error(), "no host takes new workspaces now") {
		t.Errorf("create with the only host LOST: %v, want resource_exhausted saying no host takes workspaces", err)
	}

	// The host reports again: the workspace is AVAILABLE as it was.
	ws := report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.Generation != 1 || s.hostState(t, "h1").Lost {
		t.Fatalf("after the host came back: %v, host %+v", ws, s.hostState(t, "h1"))
	}

	// A NORMAL stop of an UNKNOWN workspace waits for the host; a FORCE
	// stop releases it.
	lose(ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN)
	ws, err := Stop(ctx, s, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_NORMAL, identity)
	if err != nil || ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		t.Fatalf("NORMAL stop of an UNKNOWN workspace: %v, %v; want UNKNOWN", ws.GetState(), err)
	}
	ws, err = Stop(ctx, s, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_FORCE, identity)
	if err != nil || ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED ||
		ws.LastStop.GetDurability() != ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED || ws.LastStop.GetCompletedAt() == nil {
		t.Fatalf("FORCE stop of an UNKNOWN workspace: %v, %v; want STOPPED, UNCONFIRMED", ws, err)
	}
	// The host comes back and reports the released execution running, then
	// stopped: the workspace stays STOPPED.
	for _, st := range []hostv1.ObservedState{hostv1.ObservedState_OBSERVED_STATE_RUNNING, hostv1.ObservedState_OBSERVED_STATE_STOPPED} {
		if ws = report(t, s, ctx, id, st, nil); ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || ws.Generation != 1 {
			t.Fatalf("report %v of the released execution: %v", st, ws)
		}
	}

	// Lost again, with a second host: a STOPPED workspace stays STOPPED,
	// and its start moves it there.
	lose(ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h2", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DrainHost(ctx, "h2", true); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ctx, s, write("start", newWS), id, identity); connect.CodeOf(err) != connect.CodeResourceExhausted ||
		!strings.Contains(err.Error(), "no host takes new workspaces now") {
		t.Errorf("start with its host LOST and the other drained: %v, want resource_exhausted saying no host takes workspaces", err)
	}
	if _, err := s.DrainHost(ctx, "h2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ctx, s, write("start", newWS), id, identity); err != nil {
		t.Fatal(err)
	}
	h1, err := s.Assignments(ctx, "h1")
	if err != nil || len(h1.Assignments) != 0 {
		t.Errorf("h1's assignments after the move: %v, %v", h1, err)
	}
	h2, err := s.Assignments(ctx, "h2")
	if err != nil || len(h2.Assignments) != 1 || h2.Assignments[0].ExecutionId != id+"-2" {
		t.Fatalf("h2's assignments after the move: %v, %v", h2, err)
	}
	if err := s.Report(ctx, "h2", []*hostv1.ExecutionReport{{ExecutionId: id + "-2", WorkspaceId: id, Generation: 2,
		State: hostv1.ObservedState_OBSERVED_STATE_RUNNING}}, nil); err != nil {
		t.Fatal(err)
	}
	ws, _ = s.Get(ctx, id)
	var reset bool
	for _, tier := range ws.GetRetentionTiers() {
		reset = reset || tier.ResetReason == ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_LAYER_UNAVAILABLE
	}
	if ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.GetGeneration() != 2 || !reset {
		t.Errorf("on h2: %v; want AVAILABLE at generation 2, RESET with LAYER_UNAVAILABLE", ws)
	}
	if _, err := s.DrainHost(ctx, "nope", true); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("drain of an unknown host: %v", err)
	}
	// An empty ID names no host (it had drained the first listed).
	if _, err := s.DrainHost(ctx, "", true); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("drain of host \"\": %v, want invalid_argument", err)
	}
	if hosts, _ := s.ListHosts(ctx); slices.ContainsFunc(hosts, func(h HostView) bool { return h.Drained }) {
		t.Errorf("a refused drain drained a host: %v", hosts)
	}
}

// TestHostLeaseVolumes: the Volumes of a LOST host are UNKNOWN and
// refuse what needs their host; they take their states again when it
// reports.
func TestHostLeaseVolumes(t *testing.T) {
	s, ctx := newVolumeService(t)
	c := &clock{now: time.Now().Add(time.Hour)}
	s.Now = c.get
	if err := s.ExpireLeases(ctx); err != nil { // the ctrl's start: leases count from here
		t.Fatal(err)
	}
	v, err := volumes.Create(ctx, s.Volumes, write("create", newVol), &ctrlv1.VolumeSpec{}, nil, nil, volumeIdentity)
	if err != nil {
		t.Fatal(err)
	}
	if v = volumeReport(t, s, ctx, healthy(v.VolumeId, 256*MiB)); v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		t.Fatalf("created: %v", v)
	}
	// h2 reports on the test's clock too, so that only h1 is lost.
	c.add(s.Lease())
	if err := s.Report(ctx, "h2", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ = s.Volumes.Get(ctx, v.VolumeId); v.State != ctrlv1.VolumeState_VOLUME_STATE_UNKNOWN {
		t.Fatalf("volume of a LOST host: %v", v.State)
	}
	if s.hostState(t, "h2").Lost {
		t.Error("h2 reported within the lease and is LOST")
	}
	_, err = Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20},
		Volume: &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: v.VolumeId, MountPath: "/data"}}, nil, nil, identity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("binding an UNKNOWN volume: %v, want failed_precondition", err)
	}
	if v = volumeReport(t, s, ctx, healthy(v.VolumeId, 256*MiB)); v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		t.Errorf("volume once its host reports: %v", v.State)
	}
}

// TestHostLeaseReplicas: several control planes on one PostgreSQL store
// run the lease pass at once; the host is LOST once, with no error, and
// its workspace UNKNOWN.
func TestHostLeaseReplicas(t *testing.T) {
	st := testutil.PostgresStore(t)
	ctx := context.Background()
	templatetest.Seed(t, st, time.Now(), "p1")
	c := &clock{now: time.Now()}
	replica := func() *Service {
		return &Service{Store: st, Pages: pagetoken.New([]byte("k")), Checker: &netcheck.Checker{}, Changes: changes.NewBroker(), Now: c.get}
	}
	s := replica()
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	actx := auth.WithCaller(ctx, auth.Caller{ProjectID: "p1", Role: auth.Admin})
	id := create(t, s, actx, 512<<20).WorkspaceId
	// The replicas run, each having passed its first lease check.
	replicas := make([]*Service, 8)
	for i := range replicas {
		replicas[i] = replica()
		if err := replicas[i].ExpireLeases(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c.add(s.Lease())
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for _, r := range replicas {
		wg.Go(func() { errs <- r.ExpireLeases(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a replica's lease pass: %v", err)
		}
	}
	h := s.hostState(t, "h1")
	if ws, _ := s.Get(actx, id); !h.Lost || ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		t.Fatalf("after the passes: host %+v, workspace %v", h, ws.GetState())
	}
	// The state it had is kept once, not overwritten by a later pass.
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	if ws, _ := s.Get(actx, id); ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING {
		t.Errorf("after the host came back: %v, want CREATING again", ws.GetState())
	}
}

// TestHostLeaseCountsFromCtrlStart: a ctrl that starts long after a
// host's last report (it was down, and the host could not report) gives
// the host a whole lease to report before it is LOST.
func TestHostLeaseCountsFromCtrlStart(t *testing.T) {
	s, ctx, c, id := newLeaseService(t)

	c.add(3 * s.Lease()) // ctrl was down
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if ws, _ := s.Get(ctx, id); ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || s.hostState(t, "h1").Lost {
		t.Fatalf("at the ctrl's first lease check: %v, host %+v; want it AVAILABLE on a host not LOST", ws.GetState(), s.hostState(t, "h1"))
	}
	c.add(s.Lease()) // and the host stays silent a whole lease more
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.hostState(t, "h1").Lost {
		t.Error("a host silent for a lease after the ctrl started is not LOST")
	}
}

// TestLayerLeftBehindIsNeverTakenBack: a workspace that starts off a LOST
// host gets a writable layer of a new name, so that when it later comes
// back to that host, the layer it left there (which the host may still
// keep) is not taken for its current one and reported CONTINUED. The
// layers left behind, and that of a workspace deleted while its host was
// LOST, are the ones CollectableLayers lets the hosts delete.
func TestLayerLeftBehindIsNeverTakenBack(t *testing.T) {
	s, ctx := newService(t)
	c := &clock{now: time.Now()}
	s.Now = c.get
	if err := s.ExpireLeases(ctx); err != nil { // the ctrl's start
		t.Fatal(err)
	}
	register := func(host string, memory uint64) {
		t.Helper()
		if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: host, Capacity: &hostv1.HostCapacity{
			CpuMillis: 4000, MemoryBytes: memory, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
			t.Fatal(err)
		}
	}
	layerOn := func(host, id string) string {
		t.Helper()
		as, err := s.Assignments(ctx, host)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as.Assignments {
			if a.WorkspaceId == id {
				return a.LayerId
			}
		}
		t.Fatalf("no assignment of %s on %s", id, host)
		return ""
	}
	// moveOff loses from, whose workspace then starts on to.
	moveOff := func(from, to, id string) {
		t.Helper()
		c.add(s.Lease())
		register(to, 4*gib)
		if err := s.ExpireLeases(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := forceRestart(t, s, ctx, id); err != nil {
			t.Fatal(err)
		}
		register(from, gib) // back, but silent for the workspace
	}
	register("h1", 4*gib)
	id := create(t, s, ctx, 512<<20).WorkspaceId
	first := layerOn("h1", id)
	moveOff("h1", "h2", id)
	second := layerOn("h2", id)
	moveOff("h2", "h1", id)
	third := layerOn("h1", id)
	if first == second || third == first || third == second {
		t.Errorf("layers %q on h1, then %q on h2, then %q on h1 again: want three names", first, second, third)
	}

	// The hosts may delete the layers left behind, never the current one
	// nor one of a workspace this ctrl does not know.
	collectable := func(host string, ids ...string) []string {
		t.Helper()
		dead, err := s.CollectableLayers(ctx, host, ids)
		if err != nil {
			t.Fatal(err)
		}
		return dead
	}
	if got := collectable("h1", third, first, "ws_unknown", "ws_unknown.1"); !slices.Equal(got, []string{first}) {
		t.Errorf("collectable on h1 of %s, %s and unknown ones: %v, want %s", third, first, got, first)
	}
	if got := collectable("h2", second); !slices.Equal(got, []string{second}) {
		t.Errorf("collectable on h2: %v, want %s", got, second)
	}
	// A workspace deleted while its host is LOST: its layer too.
	gone := create(t, s, ctx, 128<<20).WorkspaceId
	layerOn("h1", gone)
	c.add(s.Lease())
	register("h2", 4*gib)
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Delete(ctx, s, write("delete", newWS), gone, identity); err != nil {
		t.Fatal(err)
	}
	if ws, _ := s.Get(ctx, gone); ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		t.Fatalf("workspace deleted on a LOST host is %v", ws.GetState())
	}
	register("h1", 4*gib)
	if got := collectable("h1", gone, third); !slices.Equal(got, []string{gone}) {
		t.Errorf("collectable on h1 after %s was deleted: %v, want it alone", gone, got)
	}
	if _, err := s.CollectableLayers(ctx, "h1", make([]string, MaxCollectableLayers+1)); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("%d layer IDs at once: %v, want invalid_argument", MaxCollectableLayers+1, err)
	}
	if _, err := s.CollectableLayers(ctx, "h9", []string{gone}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("an unregistered host: %v, want not_found", err)
	}
}

// TestEachExecutionHasItsOwnDataPlaneKey: a workspace's new execution, a
// start on its host or one on another host after its own was LOST, has a
// data-plane key of its own: a host that ran an earlier execution, whose
// assignment carried that one's key, cannot sign a session token the new
// execution's host accepts.
func TestEachExecutionHasItsOwnDataPlaneKey(t *testing.T) {
	s, ctx, c, id := newLeaseService(t)
	if err := s.ExpireLeases(ctx); err != nil { // the ctrl's start: leases count from here
		t.Fatal(err)
	}
	assignment := func(host string) *hostv1.Assignment {
		t.Helper()
		as, err := s.Assignments(ctx, host)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as.Assignments {
			if a.WorkspaceId == id {
				return a
			}
		}
		t.Fatalf("no assignment of %s on %s", id, host)
		return nil
	}
	// forgedAccepted reports whether a token signed with key, for the
	// execution a assigns, passes a's host's check.
	forgedAccepted := func(key []byte, a *hostv1.Assignment) bool {
		t.Helper()
		tok, err := sessiontoken.Parse(sessiontoken.Sign(key, sessiontoken.Claims{SessionID: "ses_forged", WorkspaceID: id,
			Generation: a.Generation, ExpiresAt: c.get().Add(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		return tok.Verify(sessiontoken.Authority{WorkspaceID: id, Generation: a.Generation, Key: a.GetDataPlane().GetKey()}, c.get()) == nil
	}
	first := assignment("h1").GetDataPlane().GetKey()
	// The host bounds the data-plane calls of each project.
	if caller, _ := auth.CallerFrom(ctx); assignment("h1").GetDataPlane().GetProjectId() != caller.ProjectID {
		t.Errorf("the data plane's project = %q, want the workspace's %q", assignment("h1").GetDataPlane().GetProjectId(), caller.ProjectID)
	}

	// Stopped and started again on h1.
	if _, err := Stop(ctx, s, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_STOPPED, nil)
	if _, err := Start(ctx, s, write("start", newWS), id, identity); err != nil {
		t.Fatal(err)
	}
	again := assignment("h1")
	if forgedAccepted(first, again) {
		t.Fatal("a token signed with the first execution's key passes the second's check")
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)

	// h1 is LOST: FORCE stopped, the workspace starts on h2.
	c.add(s.Lease())
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h2", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := forceRestart(t, s, ctx, id); err != nil {
		t.Fatal(err)
	}
	moved := assignment("h2")
	if !forgedAccepted(moved.GetDataPlane().GetKey(), moved) {
		t.Fatal("a token signed with h2's own key is refused: the check proves nothing")
	}
	if forgedAccepted(again.GetDataPlane().GetKey(), moved) {
		t.Error("a token signed with the key h1 was given passes h2's check of the workspace's execution there")
	}
}

// TestFailedRestoreIsNotStartedAgain: a restored workspace that failed
// before its first execution made its disk cannot be started again (its
// Transfer, FAILED with it, holds no artifact), and the refusal says what
// to do; one restored that failed later can be.
func TestFailedRestoreIsNotStartedAgain(t *testing.T) {
	s, ctx := newService(t)
	id := createRestored(t, s, ctx, "tr_x")
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_FAILED, func(r *hostv1.ExecutionReport) {
		r.FailureReason, r.FailureStage, r.FailureMessage = ctrlv1.FailureReason_FAILURE_REASON_INTERNAL, ctrlv1.FailureStage_FAILURE_STAGE_CREATING, "no space left on device"
	})
	_, err := Start(ctx, s, write("start", newWS), id, identity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "tr_x") {
		t.Errorf("start of a restore that failed making its disk: %v", err)
	}
}

// createRestored creates a workspace restored from the Transfer
// transferID, placed on h1.
func createRestored(t *testing.T, s *Service, ctx context.Context, transferID string) string {
	t.Helper()
	var id string
	if err := s.Store.Update(ctx, func(tx store.Tx) error {
		ws, err := s.CreateRestored(ctx, tx, "p1", &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20}},
			nil, nil, Restore{TransferID: transferID, Digest: "sha256:" + strings.Repeat("0", 64), SizeBytes: 1})
		id = ws.GetWorkspaceId()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestOnlyTheRestoringHostReadsTheArtifact: a host reads a Transfer's
// artifact only while it is assigned a workspace restored from it that
// has not run yet; another host, another Transfer, or the same one after
// the restore are permission_denied, and an unknown host not_found.
func TestOnlyTheRestoringHostReadsTheArtifact(t *testing.T) {
	s, ctx := newService(t)
	id := createRestored(t, s, ctx, "tr_x")
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h2", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckRestoring(ctx, "h1", "tr_x"); err != nil {
		t.Errorf("the restoring host: %v", err)
	}
	for _, c := range []struct {
		host, transfer string
		want           connect.Code
	}{
		{"h2", "tr_x", connect.CodePermissionDenied},
		{"h1", "tr_y", connect.CodePermissionDenied},
		{"h9", "tr_x", connect.CodeNotFound},
		{"", "tr_x", connect.CodeInvalidArgument},
	} {
		if err := s.CheckRestoring(ctx, c.host, c.transfer); connect.CodeOf(err) != c.want {
			t.Errorf("host %q reading transfer %q: %v, want %v", c.host, c.transfer, err, c.want)
		}
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	if err := s.CheckRestoring(ctx, "h1", "tr_x"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("the host of the restored workspace once it ran: %v, want permission_denied", err)
	}
}

// TestHostStateChanged: a registration of a live host with another
// state_id (a second agent under its name, or one whose layers are gone)
// is refused and changes nothing; the same state registers again at once.
// Once the lease has passed it is taken (and the agent it replaced is
// refused from then on), and the workspace the host ran
// starts again there as a new execution (the next generation: no
// execution ID or session of the one lost), on an empty layer: AVAILABLE,
// RESET with LAYER_UNAVAILABLE, processes and sessions to reestablish,
// never CONTINUED.
func TestHostStateChanged(t *testing.T) {
	s, ctx, c, id := newLeaseService(t)
	register := func(state, endpoint string) error {
		return s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", StateId: state, DataPlaneEndpoint: endpoint,
			Capacity: &hostv1.HostCapacity{CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}})
	}
	if err := register("state-a", "http://a"); err != nil {
		t.Fatal(err)
	}
	c.add(s.Lease() / 2)
	err := register("state-b", "http://b")
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "served by another agent") {
		t.Fatalf("another state while the host is live: %v, want failed_precondition saying why", err)
	}
	if s.hostState(t, "h1").Registration.GetDataPlaneEndpoint() != "http://a" {
		t.Error("the refused registration moved the host's endpoint")
	}
	if err := register("state-a", "http://a"); err != nil {
		t.Fatalf("the same state again: %v", err)
	}
	if err := s.CheckAgent(ctx, "h1", "state-a"); err != nil {
		t.Fatalf("the registered agent's call: %v", err)
	}

	c.add(s.Lease())
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if err := register("state-b", "http://b"); err != nil {
		t.Fatalf("another state once the lease passed: %v", err)
	}
	// The agent it replaced takes no assignment and renews no lease.
	if err := s.CheckAgent(ctx, "h1", "state-a"); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "served by another agent now") {
		t.Errorf("a call of the replaced agent: %v, want failed_precondition saying why", err)
	}
	for _, state := range []string{"state-b", ""} {
		if err := s.CheckAgent(ctx, "h1", state); err != nil {
			t.Errorf("a call of state %q: %v", state, err)
		}
	}
	if ws, _ := s.Get(ctx, id); ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING || ws.GetGeneration() != 1 {
		t.Fatalf("once another state was taken: %v at generation %d, want STARTING again", ws.GetState(), ws.GetGeneration())
	}
	as, err := s.Assignments(ctx, "h1")
	if err != nil || len(as.Assignments) != 1 || as.Assignments[0].ExecutionId != id+"-2" {
		t.Fatalf("assigned %v (%v), want the execution %s-2", as.GetAssignments(), err, id)
	}
	ws := report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	best := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT)
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.Generation != 2 || best.GetContinuity() != ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET ||
		best.GetResetReason() != ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_LAYER_UNAVAILABLE || len(ws.Reestablish) == 0 {
		t.Errorf("the execution run again on an empty layer: %v at generation %d, tier %v, reestablish %v", ws.State, ws.Generation, best, ws.Reestablish)
	}
	// Its next reports are the execution's, which runs on.
	c.add(time.Second)
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.LayerContinued = true })
	if best := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT); best.GetResetReason() != ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_LAYER_UNAVAILABLE {
		t.Errorf("a later report changed the tier: %v", best)
	}
}

// unreachableStore is a store whose writes fail while down is set, as
// when ctrl cannot reach PostgreSQL.
type unreachableStore struct {
	store.Store
	down atomic.Bool
}

func (u *unreachableStore) Update(ctx context.Context, fn func(store.Tx) error) error {
	if u.down.Load() {
		return errors.New("the store does not answer")
	}
	return u.Store.Update(ctx, fn)
}

// TestLeasesAfterAStoreOutage: hosts that could not report while ctrl's
// store was unreachable, for longer than a lease, get a lease to report
// once it answers again, as after a restart of ctrl.
func TestLeasesAfterAStoreOutage(t *testing.T) {
	s, ctx, c, id := newLeaseService(t)
	u := &unreachableStore{Store: s.Store}
	s.Store = u
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	u.down.Store(true)
	for range 3 {
		c.add(s.Lease() / 2)
		if err := s.ExpireLeases(ctx); err == nil {
			t.Fatal("ExpireLeases on an unreachable store succeeded")
		}
	}
	u.down.Store(false)
	c.add(time.Second)
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if ws, _ := s.Get(ctx, id); ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || s.hostState(t, "h1").Lost {
		t.Errorf("right after the outage: %v, host %+v; want AVAILABLE on a live host", ws.GetState(), s.hostState(t, "h1"))
	}
	c.add(s.Lease())
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.hostState(t, "h1").Lost {
		t.Error("a host silent for a lease after the outage is not LOST")
	}
}
