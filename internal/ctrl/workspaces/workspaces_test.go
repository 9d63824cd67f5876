package workspaces

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates/templatetest"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
)

// These tests drive the state machine with simulated host reports; the
// real host agent and runtime are exercised by internal/daemon's tests.

const gib = 1 << 30

func newService(t testing.TB) (*Service, context.Context) {
	t.Helper()
	st := testutil.SQLiteStore(t)
	ctx := context.Background()
	templatetest.Seed(t, st, time.Now(), "p1")
	s := &Service{Store: st, Pages: pagetoken.New([]byte("k")), Checker: &netcheck.Checker{}, Changes: changes.NewBroker()}
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	return s, auth.WithCaller(ctx, auth.Caller{ProjectID: "p1", Role: auth.Admin})
}

// watch watches workspace id until the test ends and returns a function
// that waits for its next update.
func watch(t *testing.T, s *Service, ctx context.Context, id string) func() *ctrlv1.Workspace {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	updates := make(chan *ctrlv1.Workspace, 10)
	go s.Watch(wctx, id, time.Hour, func(ws *ctrlv1.Workspace) error { updates <- ws; return nil })
	next := func() *ctrlv1.Workspace {
		select {
		case ws := <-updates:
			return ws
		case <-time.After(5 * time.Second):
			t.Fatal("no watch update")
			return nil
		}
	}
	return next
}

func write[R proto.Message](method string, newR func() R) Write[R] {
	return Write[R]{Method: method, Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
		Input: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, New: newR}
}

func identity(ws *ctrlv1.Workspace) *ctrlv1.Workspace { return ws }

func newWS() *ctrlv1.Workspace { return new(ctrlv1.Workspace) }

func create(t testing.TB, s *Service, ctx context.Context, memory uint64) *ctrlv1.Workspace {
	t.Helper()
	ws, err := Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: memory}}, nil, nil, identity)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return ws
}

// forceRestart stops workspace id by force and starts it again, where
// placement puts it now.
func forceRestart(t *testing.T, s *Service, ctx context.Context, id string) (*ctrlv1.Workspace, error) {
	t.Helper()
	if _, err := Stop(ctx, s, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_FORCE, identity); err != nil {
		t.Fatal(err)
	}
	return Start(ctx, s, write("start", newWS), id, identity)
}

// report sends one host report for the workspace's current execution.
func report(t *testing.T, s *Service, ctx context.Context, id string, state hostv1.ObservedState, edit func(*hostv1.ExecutionReport)) *ctrlv1.Workspace {
	t.Helper()
	as, err := s.Assignments(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as.Assignments {
		if a.WorkspaceId != id {
			continue
		}
		r := &hostv1.ExecutionReport{ExecutionId: a.ExecutionId, WorkspaceId: id, Generation: a.Generation, State: state}
		if edit != nil {
			edit(r)
		}
		if err := s.Report(ctx, "h1", []*hostv1.ExecutionReport{r}, nil); err != nil {
			t.Fatal(err)
		}
	}
	ws, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

func TestStateMachine(t *testing.T) {
	s, ctx := newService(t)
	ws := create(t, s, ctx, 512<<20)
	if ws.Spec.Resources.CpuMillis != DefaultCPUMilli || ws.Spec.Template.Revision != "sha256-1" {
		t.Errorf("created: %v", ws.Spec)
	}
	id := ws.WorkspaceId
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_DELIVERING, func(r *hostv1.ExecutionReport) {
		r.DeliveryBytesTotal, r.DeliveryBytesDelivered = 100, 40
	})
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING || ws.Delivery.GetBytesDelivered() != 40 || ws.Delivery.GetBytesTotal() != 100 {
		t.Errorf("delivering: %v %v", ws.State, ws.Delivery)
	}
	layer := uint64(gib)
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.LayerCapacityBytes = &layer })
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.Generation != 1 || ws.Delivery != nil || len(ws.Reestablish) != 0 {
		t.Errorf("running: %v", ws)
	}

	// A stale report of an older execution changes nothing.
	if err := s.Report(ctx, "h1", []*hostv1.ExecutionReport{{ExecutionId: id + "-0", WorkspaceId: id,
		State: hostv1.ObservedState_OBSERVED_STATE_FAILED}}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, id); got.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Errorf("stale report moved the workspace to %v", got.State)
	}

	if _, err := Stop(ctx, s, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_STOPPED, func(r *hostv1.ExecutionReport) {
		r.StopDurability = ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED
	})
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || ws.LastStop.GetDurability() != ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED {
		t.Errorf("stopped: %v %v", ws.State, ws.LastStop)
	}

	// While it is stopped another workspace takes the memory: starting it
	// again is resource_exhausted and changes nothing.
	other := create(t, s, ctx, 768<<20)
	_, err := Start(ctx, s, write("start", newWS), id, identity)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "no host has the memory this workspace needs free") {
		t.Errorf("start without memory: %v, want resource_exhausted naming memory alone", err)
	}
	if got, _ := s.Get(ctx, id); got.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Errorf("refused start moved the workspace to %v", got.State)
	}
	if _, err := Delete(ctx, s, write("delete", newWS), other.WorkspaceId, identity); err != nil {
		t.Fatal(err)
	}
	report(t, s, ctx, other.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_DELETED, nil)

	if _, err := Start(ctx, s, write("start", newWS), id, identity); err != nil {
		t.Fatalf("start: %v", err)
	}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_FAILED, func(r *hostv1.ExecutionReport) {
		r.FailureStage, r.FailureReason, r.FailureMessage = ctrlv1.FailureStage_FAILURE_STAGE_WAITING_FOR_READINESS, ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT, "no answer"
	})
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || ws.Failure.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_WAITING_FOR_READINESS ||
		ws.Failure.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT || ws.Generation != 1 {
		t.Errorf("failed start: %v", ws)
	}
	if _, err := Start(ctx, s, write("start", newWS), id, identity); err != nil {
		t.Fatalf("retry from FAILED: %v", err)
	}
	// The failed attempt's last report, sent again by a heartbeat, does
	// not fail the retry: the retry is another execution.
	if err := s.Report(ctx, "h1", []*hostv1.ExecutionReport{{ExecutionId: id + "-2", WorkspaceId: id, Generation: 2,
		State: hostv1.ObservedState_OBSERVED_STATE_FAILED}}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, id); got.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING {
		t.Errorf("stale report of the failed attempt moved the retry to %v", got.State)
	}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) {
		r.LayerCapacityBytes, r.LayerContinued = &layer, true
	})
	best := ws.RetentionTiers[1]
	if ws.Generation != 2 || best.Continuity != ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_CONTINUED || len(ws.Reestablish) != 2 {
		t.Errorf("second start: gen %d, %v, reestablish %v", ws.Generation, best, ws.Reestablish)
	}

	// The guest shutting down is a forced stop.
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_EXITED, nil)
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING || ws.LastStop.GetCause() != ctrlv1.StopCause_STOP_CAUSE_GUEST_SHUTDOWN {
		t.Errorf("exited: %v %v", ws.State, ws.LastStop)
	}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_STOPPED, func(r *hostv1.ExecutionReport) {
		r.StopDurability = ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED
	})
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Errorf("after exit: %v", ws.State)
	}

	del, err := Delete(ctx, s, write("delete", newWS), id, identity)
	if err != nil || del.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING {
		t.Fatalf("delete: %v, %v", del, err)
	}
	if again, err := Delete(ctx, s, write("delete", newWS), id, identity); err != nil || again.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING {
		t.Errorf("second delete: %v, %v", again, err)
	}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_DELETED, nil)
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		t.Errorf("deleted: %v", ws.State)
	}
	// Its writable layer and its tmpfs are gone.
	for _, tier := range ws.RetentionTiers[1:] {
		if tier.Availability != ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_UNAVAILABLE || tier.CapacityBytes != nil {
			t.Errorf("a deleted workspace's tier %v", tier)
		}
	}
	if as, _ := s.Assignments(ctx, "h1"); len(as.Assignments) != 0 {
		t.Errorf("assignments after every delete: %v", as)
	}
	_, err = Start(ctx, s, write("start", newWS), id, identity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("start of a deleted workspace: %v", err)
	}
}

func TestLabelsSelectorsAndWatch(t *testing.T) {
	s, ctx := newService(t)
	a := create(t, s, ctx, 128<<20)
	create(t, s, ctx, 128<<20)
	if _, err := UpdateMap(ctx, s, write("labels", newWS), resource.Labels, a.WorkspaceId, 1, map[string]string{"team": "x"}, identity); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Get(ctx, a.WorkspaceId)
	same, err := UpdateMap(ctx, s, write("labels", newWS), resource.Labels, a.WorkspaceId, 2, map[string]string{"team": "x"}, identity)
	if err != nil || same.LabelsRevision != 2 || !same.UpdatedAt.AsTime().Equal(before.UpdatedAt.AsTime()) {
		t.Errorf("equal labels changed the workspace: %v, %v", same, err)
	}
	_, err = UpdateMap(ctx, s, write("labels", newWS), resource.Labels, a.WorkspaceId, 1, map[string]string{"team": "y"}, identity)
	if connect.CodeOf(err) != connect.CodeAborted {
		t.Errorf("stale labels revision: %v", err)
	}
	list, _, err := s.List(ctx, 0, "", map[string]string{"team": "x"})
	if err != nil || len(list) != 1 || list[0].WorkspaceId != a.WorkspaceId || list[0].LabelsRevision != 2 {
		t.Errorf("selected: %v, %v", list, err)
	}

	next := watch(t, s, ctx, a.WorkspaceId)
	if first := next(); first.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING {
		t.Errorf("first watch message: %v", first.State)
	}
	report(t, s, ctx, a.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	if got := next(); got.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Errorf("watch after running: %v", got.State)
	}
}

// TestReportsInOneBatch applies two reports of one execution sent in one
// request: the second builds on the first.
func TestReportsInOneBatch(t *testing.T) {
	s, ctx := newService(t)
	ws := create(t, s, ctx, 128<<20)
	report(t, s, ctx, ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	as, err := s.Assignments(ctx, "h1")
	if err != nil || len(as.Assignments) != 1 {
		t.Fatal(as, err)
	}
	exec := as.Assignments[0].ExecutionId
	err = s.Report(ctx, "h1", []*hostv1.ExecutionReport{
		{ExecutionId: exec, WorkspaceId: ws.WorkspaceId, State: hostv1.ObservedState_OBSERVED_STATE_EXITED},
		{ExecutionId: exec, WorkspaceId: ws.WorkspaceId, State: hostv1.ObservedState_OBSERVED_STATE_STOPPED,
			StopDurability: ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, ws.WorkspaceId); got.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED ||
		got.LastStop.GetCause() != ctrlv1.StopCause_STOP_CAUSE_GUEST_SHUTDOWN {
		t.Errorf("after EXITED and STOPPED in one batch: %v %v", got.State, got.LastStop)
	}
}

// TestDirectResolverUpstreamIsRangeChecked refuses a policy that sends
// DNS directly to a private upstream, and stores nothing.
func TestDirectResolverUpstreamIsRangeChecked(t *testing.T) {
	s, ctx := newService(t)
	for id, addr := range map[string]string{"rsv_private": "10.0.0.53:53", "rsv_public": "9.9.9.9:53"} {
		spec, _ := proto.Marshal(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: addr}}})
		if err := s.Store.Update(ctx, func(tx store.Tx) error {
			return tx.CreateObject(ctx, store.Object{Kind: store.KindResolver, ProjectID: "p1", ID: id, Spec: spec, Revision: 1,
				LabelsRevision: 1, AnnotationsRevision: 1, CreatedAt: time.Now(), UpdatedAt: time.Now()})
		}); err != nil {
			t.Fatal(err)
		}
	}
	policy := func(resolver string) *ctrlv1.WorkspaceCreateSpec {
		return &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20},
			NetworkPolicy: &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET,
				Resolvers: []*ctrlv1.NetworkPolicyResolver{{ResolverId: resolver,
					Path: &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_Direct{Direct: &ctrlv1.ResolverDirectPath{}}}}}}}
	}
	_, err := Create(ctx, s, write("create", newWS), policy("rsv_private"), nil, nil, identity)
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("direct path to a private upstream: %v", err)
	}
	if list, _, _ := s.List(ctx, 0, "", nil); len(list) != 0 {
		t.Errorf("refused create stored %d workspaces", len(list))
	}
	ws, err := Create(ctx, s, write("create", newWS), policy("rsv_public"), nil, nil, identity)
	if err != nil || ws.Spec.NetworkPolicy.Revision != 1 {
		t.Errorf("direct path to a public upstream: %v, %v", ws, err)
	}
}

// TestReadsShareNoState: Get and List present records that reads share
// (decodedBodies); what a caller does to a workspace it read must not show
// in the next read, and a change must.
func TestReadsShareNoState(t *testing.T) {
	s, ctx := newService(t)
	a := create(t, s, ctx, 128<<20)
	first, err := s.Get(ctx, a.WorkspaceId)
	if err != nil {
		t.Fatal(err)
	}
	want := proto.CloneOf(first)
	first.Labels = map[string]string{"mine": "x"}
	first.Spec.Resources.MemoryBytes = 1
	first.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
	listed, _, err := s.List(ctx, 0, "", nil)
	if err != nil || len(listed) != 1 {
		t.Fatalf("list: %v, %v", listed, err)
	}
	listed[0].Spec.Resources.MemoryBytes = 2
	again, err := s.Get(ctx, a.WorkspaceId)
	if err != nil || !proto.Equal(again, want) {
		t.Fatalf("second read = %v, %v; want %v", again, err, want)
	}
	if _, err := UpdateMap(ctx, s, write("labels", newWS), resource.Labels, a.WorkspaceId, 1, map[string]string{"team": "x"}, identity); err != nil {
		t.Fatal(err)
	}
	changed, err := s.Get(ctx, a.WorkspaceId)
	if err != nil || changed.Labels["team"] != "x" || changed.LabelsRevision != 2 || changed.Spec.Resources.MemoryBytes != 128<<20 {
		t.Errorf("read after a label change = %v, %v", changed, err)
	}
}

// TestForceStopIsNeverConfirmed: a FORCE stop that escalates a NORMAL one
// is recorded UNCONFIRMED, even when the host reports the stop it finished
// synced.
func TestForceStopIsNeverConfirmed(t *testing.T) {
	s, ctx := newService(t)
	id := create(t, s, ctx, 512<<20).WorkspaceId
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	for _, mode := range []ctrlv1.StopMode{ctrlv1.StopMode_STOP_MODE_NORMAL, ctrlv1.StopMode_STOP_MODE_FORCE} {
		if _, err := Stop(ctx, s, write("stop", newWS), id, mode, identity); err != nil {
			t.Fatal(err)
		}
	}
	ws := report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_STOPPED, func(r *hostv1.ExecutionReport) {
		r.StopDurability = ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED
	})
	if ls := ws.LastStop; ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || ls.GetMode() != ctrlv1.StopMode_STOP_MODE_FORCE ||
		ls.GetDurability() != ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED {
		t.Errorf("a FORCE stop reported synced: %v %v", ws.State, ls)
	}
}

// TestRaiseBeyondTheHost: a memory raise of a running workspace to more
// than its host has at all says that no wait makes it fit; one that does
// not fit beside the others now says to retry later; one while it stops
// says when memory changes.
func TestRaiseBeyondTheHost(t *testing.T) {
	s, ctx := newService(t) // a host of 1 GiB
	ws := create(t, s, ctx, 512<<20)
	ws = report(t, s, ctx, ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	create(t, s, ctx, 384<<20)
	// The raise alone (768 MiB) is less than the host has.
	_, err := UpdateMemory(ctx, s, write("memory", newWS), ws.WorkspaceId, ws.Spec.ResourcesRevision, 1280<<20, identity)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "large enough for the memory this") {
		t.Errorf("a raise to more than the host's memory: %v, want resource_exhausted saying no host is large enough for the memory", err)
	}
	_, err = UpdateMemory(ctx, s, write("memory", newWS), ws.WorkspaceId, ws.Spec.ResourcesRevision, 768<<20, identity)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "retry later") {
		t.Errorf("a raise that fits the host but not beside the others: %v, want resource_exhausted saying to retry later", err)
	}
	// While it stops, the refusal says when memory changes.
	if _, err := Stop(ctx, s, write("stop", newWS), ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	_, err = UpdateMemory(ctx, s, write("memory", newWS), ws.WorkspaceId, ws.Spec.ResourcesRevision, 640<<20, identity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "raised while it is AVAILABLE") {
		t.Errorf("a raise while STOPPING: %v, want failed_precondition saying when memory changes", err)
	}
}
