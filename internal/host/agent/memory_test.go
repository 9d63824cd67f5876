package agent

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/psi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// memoryCondition is the memory condition a report's guest carries.
func memoryCondition(r *hostv1.ExecutionReport) ctrlv1.GuestMemoryCondition {
	return r.Guest.GetMemoryCondition()
}

// TestGuestMemory: a guest under no pressure is NORMAL; held at its limit
// it is SATURATED since the first saturated judgment, and once that lasts
// its largest process (never the agent) is killed and reported; it is
// NORMAL again once the pressure is gone. While the guest does not answer
// the condition is unknown but the kills stand; without pressure
// information it is unknown too.
func TestGuestMemory(t *testing.T) {
	e := newReconcilerEnv(t)
	th := psi.Thresholds{Window: 100 * time.Millisecond, SaturatedPermille: 500, KillAfter: 300 * time.Millisecond}
	e.cfg.GuestMemory = th
	e.runAgent(t, e.driver)
	as := e.assignment("ws_memory", 1, "lay_memory")
	mark := e.api.mark()
	e.api.assign(as.ExecutionId, as)
	r := e.api.awaitReport(t, mark, as.ExecutionId, "NORMAL", func(r *hostv1.ExecutionReport) bool {
		return memoryCondition(r) == ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_NORMAL
	})
	if g := r.Guest; g.MemorySaturatedSince != nil || g.MemoryKillCount != 0 || g.LatestMemoryKill != nil {
		t.Errorf("NORMAL: %v", g)
	}

	sh := runtime.GuestProcess{PID: 7, Command: "sh", RSSBytes: 80 << 20}
	cat := runtime.GuestProcess{PID: 9, Command: "cat", RSSBytes: 1 << 20}
	e.driver.SetProcesses(as.ExecutionId, []runtime.GuestProcess{{PID: 1, Command: "kibotos-guest", RSSBytes: 200 << 20}, sh, cat})
	mark = e.api.mark()
	saturated := time.Now()
	e.driver.Saturate(as.ExecutionId)
	r = e.api.awaitReport(t, mark, as.ExecutionId, "SATURATED", func(r *hostv1.ExecutionReport) bool {
		return memoryCondition(r) == ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_SATURATED
	})
	since := r.Guest.MemorySaturatedSince
	// Saturated once half the window was stalled.
	if g := r.Guest; since.AsTime().Before(saturated.Add(th.Window/2)) || g.MemoryKillCount != 0 || g.LatestMemoryKill != nil {
		t.Errorf("SATURATED (saturating since %v): %v", saturated, g)
	}
	r = e.api.awaitReport(t, mark, as.ExecutionId, "a memory kill", func(r *hostv1.ExecutionReport) bool {
		return r.Guest.GetMemoryKillCount() == 1
	})
	k := r.Guest.LatestMemoryKill
	if k.GetPid() != sh.PID || k.Command != sh.Command || k.RssBytes != sh.RSSBytes || k.FullStallPermille < th.SaturatedPermille ||
		k.Window.AsDuration() < th.Window || k.SaturatedFor.AsDuration() < th.KillAfter || k.KilledAt.AsTime().Before(since.AsTime().Add(th.KillAfter)) {
		t.Errorf("the kill (saturated since %v): %v", since.AsTime(), k)
	}
	if procs := e.driver.Processes(as.ExecutionId); len(procs) != 2 || procs[0].PID != 1 || procs[1] != cat {
		t.Errorf("processes after the kill: %+v", procs)
	}
	r = e.api.awaitReport(t, mark, as.ExecutionId, "NORMAL after the kill", func(r *hostv1.ExecutionReport) bool {
		return memoryCondition(r) == ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_NORMAL
	})
	if g := r.Guest; g.MemorySaturatedSince != nil || g.MemoryKillCount != 1 || !proto.Equal(g.LatestMemoryKill, k) {
		t.Errorf("NORMAL after the kill: %v", g)
	}

	mark = e.api.mark()
	e.driver.NeverReady(as.ExecutionId)
	r = e.api.awaitReport(t, mark, as.ExecutionId, "UNRESPONSIVE", func(r *hostv1.ExecutionReport) bool {
		return r.Guest.GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE
	})
	if g := r.Guest; g.MemoryCondition != ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_UNSPECIFIED || g.MemorySaturatedSince != nil ||
		g.MemoryKillCount != 1 || !proto.Equal(g.LatestMemoryKill, k) {
		t.Errorf("UNRESPONSIVE: %v", g)
	}
	mark = e.api.mark()
	e.driver.Answer(as.ExecutionId)
	e.api.awaitReport(t, mark, as.ExecutionId, "NORMAL once answering", func(r *hostv1.ExecutionReport) bool {
		return memoryCondition(r) == ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_NORMAL
	})

	mark = e.api.mark()
	e.driver.WithoutPressure(as.ExecutionId)
	r = e.api.awaitReport(t, mark, as.ExecutionId, "no pressure information", func(r *hostv1.ExecutionReport) bool {
		return memoryCondition(r) == ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_UNSPECIFIED
	})
	if g := r.Guest; g.Condition != ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING || g.MemoryKillCount != 1 {
		t.Errorf("without pressure information: %v", g)
	}
}
