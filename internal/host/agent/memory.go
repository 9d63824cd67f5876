package agent

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/host/psi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// memoryKillTimeout bounds one kill of the largest process, the wait for
// it to end included.
const memoryKillTimeout = 5 * time.Second

// memoryWatch is what the periodic probe judges of the running guest's
// memory from the kernel's pressure stall information, and the kills it
// made; execution.mu guards it.
type memoryWatch struct {
	// monitor judges the samples; nil before the first.
	monitor *psi.Monitor
	// judgment is the latest judgment; due is true while it calls for a
	// kill that is not made yet.
	judgment psi.Judgment
	due      bool
	// kills counts the processes killed; latest describes the last.
	kills  uint32
	latest *ctrlv1.GuestMemoryKill
}

// observeMemory judges the memory pressure that check c read at now and
// writes the memory fields of obs: the condition only while the guest
// answers and its pressure is known, the kills always. e.mu is held.
func (e *execution) observeMemory(obs *ctrlv1.GuestObservation, c runtime.GuestCheck, now time.Time) {
	m := &e.health.memory
	m.due = false
	if c.MemoryPressure != nil {
		if m.monitor == nil {
			m.monitor = psi.NewMonitor(e.agent.cfg.GuestMemory)
		}
		m.judgment = m.monitor.Observe(psi.Sample{At: now, Full: c.MemoryPressure.Full.Total})
		m.due = m.judgment.Kill
	}
	obs.MemoryCondition, obs.MemorySaturatedSince = ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_UNSPECIFIED, nil
	if c.ProbeErr == nil && c.MemoryPressure != nil {
		obs.MemoryCondition = ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_NORMAL
		if m.judgment.Saturated {
			obs.MemoryCondition = ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_SATURATED
			obs.MemorySaturatedSince = timestamppb.New(m.judgment.Since)
		}
	}
	obs.MemoryKillCount, obs.LatestMemoryKill = m.kills, m.latest
}

// killIfSaturated kills the guest's largest process when the latest
// judgment calls for it, and reports whether the observation changed. It
// judges from the host's view, so it kills even while the guest does not
// answer (a guest held at its limit may answer too slowly). A failed or
// refused kill (nothing but the guest agent runs) is tried again only
// once saturation lasts as long again.
func (e *execution) killIfSaturated(ctx context.Context) bool {
	e.mu.Lock()
	due, j := e.health.memory.due, e.health.memory.judgment
	e.health.memory.due = false
	e.mu.Unlock()
	if !due {
		return false
	}
	kctx, cancel := context.WithTimeout(ctx, memoryKillTimeout)
	p, err := e.agent.cfg.Driver.KillLargestProcess(kctx, e.id)
	cancel()
	now := time.Now()

	e.mu.Lock()
	defer e.mu.Unlock()
	m := &e.health.memory
	if ctx.Err() != nil || m.monitor == nil {
		return false // the execution no longer runs
	}
	m.monitor.Killed(now)
	switch {
	case errors.Is(err, runtime.ErrNoProcess):
		slog.Info("memory saturated, but nothing runs in the guest but its agent", "execution", e.id, "full_stall_permille", j.FullPermille)
		return false
	case err != nil:
		slog.Warn("killing the largest process of a saturated guest", "execution", e.id, "err", err)
		return false
	}
	m.kills++
	m.latest = &ctrlv1.GuestMemoryKill{KilledAt: timestamppb.New(now), Pid: p.PID, Command: p.Command, RssBytes: p.RSSBytes,
		FullStallPermille: j.FullPermille, Window: durationpb.New(j.Window), SaturatedFor: durationpb.New(j.SaturatedFor())}
	slog.Info("killed the largest process of a saturated guest", "execution", e.id, "pid", p.PID, "command", p.Command,
		"rss_bytes", p.RSSBytes, "full_stall_permille", j.FullPermille, "window", j.Window, "saturated_for", j.SaturatedFor())
	if obs := e.health.obs; obs != nil {
		obs.MemoryKillCount, obs.LatestMemoryKill = m.kills, m.latest
	}
	return true
}
