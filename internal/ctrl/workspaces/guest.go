package workspaces

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// applyGuest records what the host last observed of the current
// execution's guest, stamped with ctrl's clock; a RUNNING report without
// one (before the host's first probe) leaves none. An observation equal to
// the one recorded keeps its observed_at, so a heartbeat repeating it
// changes nothing and wakes no Watch.
func applyGuest(ws *ctrlv1.Workspace, g *ctrlv1.GuestObservation, now time.Time) {
	if g == nil {
		ws.GuestObservation = nil
		return
	}
	g = proto.CloneOf(g)
	if old := ws.GuestObservation; old != nil {
		g.ObservedAt = old.ObservedAt
		if proto.Equal(old, g) {
			return
		}
	}
	g.ObservedAt = timestamppb.New(now)
	ws.GuestObservation = g
}

// exitCause is the cause of the forced stop that releases an execution
// whose init ended on its own: the kernel's OOM killer, or the guest
// shutting its machine down.
func exitCause(oomKilled bool) ctrlv1.StopCause {
	if oomKilled {
		return ctrlv1.StopCause_STOP_CAUSE_HOST_MEMORY_EXHAUSTED
	}
	return ctrlv1.StopCause_STOP_CAUSE_GUEST_SHUTDOWN
}
