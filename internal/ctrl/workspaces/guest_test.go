package workspaces

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
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
