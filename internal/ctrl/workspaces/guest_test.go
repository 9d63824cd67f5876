package workspaces

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
)

// TestGuestObservation: the guest a RUNNING report carries reaches
// Workspace.guest_observation stamped with ctrl's clock, a Watch sees each
// change of condition, a repeat changes nothing, and it is gone once no
// execution is current. An execution the OOM killer ended stops with
// HOST_MEMORY_EXHAUSTED, released as a forced stop that can start again.
func TestGuestObservation(t *testing.T) {
	s, ctx := newService(t)
	id := create(t, s, ctx, 128<<20).WorkspaceId
	next := watch(t, s, ctx, id)
	next() // CREATING

	ws := report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	if ws.GuestObservation != nil {
		t.Errorf("observation before the host's first probe: %v", ws.GuestObservation)
	}
	next()
	responding := &ctrlv1.GuestObservation{Condition: ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.Guest = responding })
	if g := ws.GuestObservation; g.GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING || g.ObservedAt == nil {
		t.Errorf("RESPONDING: %v", g)
	}
	if got := next(); got.GuestObservation.GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING {
		t.Errorf("watch after RESPONDING: %v", got.GuestObservation)
	}

	since := timestamppb.New(time.Unix(1000, 0))
	unresponsive := &ctrlv1.GuestObservation{Condition: ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE, UnresponsiveSince: since, Error: "no answer"}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.Guest = unresponsive })
	if g := ws.GuestObservation; ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE ||
		g.GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE || !proto.Equal(g.UnresponsiveSince, since) || g.Error != "no answer" {
		t.Errorf("UNRESPONSIVE: %v %v", ws.State, g)
	}
	if got := next(); got.GuestObservation.GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE {
		t.Errorf("watch after UNRESPONSIVE: %v", got.GuestObservation)
	}
	// A heartbeat repeating it changes nothing.
	again := report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.Guest = unresponsive })
	if !proto.Equal(again, ws) {
		t.Errorf("a repeated observation changed the workspace: %v", again.GuestObservation)
	}

	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_EXITED, func(r *hostv1.ExecutionReport) { r.OomKilled = true })
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING || ws.LastStop.GetCause() != ctrlv1.StopCause_STOP_CAUSE_HOST_MEMORY_EXHAUSTED ||
		ws.LastStop.GetMode() != ctrlv1.StopMode_STOP_MODE_FORCE {
		t.Errorf("OOM end: %v %v", ws.State, ws.LastStop)
	}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_STOPPED, nil)
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || ws.GuestObservation != nil {
		t.Errorf("after the OOM stop: %v %v", ws.State, ws.GuestObservation)
	}
	if _, err := Start(ctx, s, write("start", newWS), id, identity); err != nil {
		t.Errorf("start after the OOM stop: %v", err)
	}
}

// TestGuestMemoryObservation: the memory condition and kills a RUNNING
// report carries reach the workspace as the host observed them; a kill
// is a change a Watch sees, with a new observed_at.
func TestGuestMemoryObservation(t *testing.T) {
	s, ctx := newService(t)
	id := create(t, s, ctx, 128<<20).WorkspaceId
	next := watch(t, s, ctx, id)
	next() // CREATING

	since := timestamppb.New(time.Unix(2000, 0))
	saturated := &ctrlv1.GuestObservation{Condition: ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING,
		MemoryCondition: ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_SATURATED, MemorySaturatedSince: since}
	ws := report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.Guest = saturated })
	if g := ws.GuestObservation; g.GetMemoryCondition() != ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_SATURATED ||
		!proto.Equal(g.MemorySaturatedSince, since) || g.MemoryKillCount != 0 {
		t.Errorf("SATURATED: %v", g)
	}
	next()

	killed := proto.CloneOf(saturated)
	killed.MemoryKillCount = 1
	killed.LatestMemoryKill = &ctrlv1.GuestMemoryKill{KilledAt: timestamppb.New(time.Unix(2020, 0)), Pid: 23, Command: "sh",
		RssBytes: 110 << 20, FullStallPermille: 640, Window: durationpb.New(10 * time.Second), SaturatedFor: durationpb.New(20 * time.Second)}
	before := ws.GuestObservation.ObservedAt.AsTime()
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.Guest = killed })
	if g := ws.GuestObservation; g.MemoryKillCount != 1 || !proto.Equal(g.LatestMemoryKill, killed.LatestMemoryKill) || g.ObservedAt.AsTime().Before(before) {
		t.Errorf("after a kill: %v", g)
	}
	if got := next(); got.GuestObservation.GetMemoryKillCount() != 1 {
		t.Errorf("watch after a kill: %v", got.GuestObservation)
	}
}

// TestGuestResetObservation: while a guest that reset comes back, the
// host's RUNNING report carries no guest and the workspace has no
// observation, staying AVAILABLE at its generation; the next one brings
// restart_count, last_reset_at and rebooted. (A shutdown, EXITED without
// an OOM kill, is TestStateMachine's.)
func TestGuestResetObservation(t *testing.T) {
	s, ctx := newService(t)
	id := create(t, s, ctx, 128<<20).WorkspaceId
	responding := &ctrlv1.GuestObservation{Condition: ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING}
	ws := report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.Guest = responding })
	generation := ws.Generation

	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.Generation != generation || ws.GuestObservation != nil {
		t.Errorf("while the guest comes back: %v, generation %d, %v", ws.State, ws.Generation, ws.GuestObservation)
	}

	resetAt := timestamppb.New(time.Unix(2000, 0))
	back := &ctrlv1.GuestObservation{Condition: ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING, Rebooted: true, RestartCount: 1, LastResetAt: resetAt}
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) { r.Guest = back })
	if g := ws.GuestObservation; ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.Generation != generation ||
		g.GetRestartCount() != 1 || !proto.Equal(g.GetLastResetAt(), resetAt) || !g.GetRebooted() || g.GetObservedAt() == nil {
		t.Errorf("back from the reset: %v, generation %d, %v", ws.State, ws.Generation, g)
	}
}
