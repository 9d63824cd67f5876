package workspaces

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
)

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
