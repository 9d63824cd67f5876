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
