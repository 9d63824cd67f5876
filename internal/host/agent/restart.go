package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// Guest resets. An init that ended on its own ended in one of three ways
// (guestabi describes how the guest asks for each):
//   - the kernel's OOM killer ended it (endedByOOM): the execution ends,
//     EXITED with oom_killed;
//   - the guest shut its machine down (poweroff, halt: the driver reports
//     Shutdown): the execution ends, EXITED;
//   - anything else is a reset (reboot, or PID 1 dying): the guest comes
//     back within the same execution, with the same generation, writable
//     layer, Volume and network slot, and none of its processes.
//
// A guest that resets more than maxResets times within resetWindow is in
// a loop that a reset does not mend: its execution ends as a shutdown,
// and a caller can start the workspace again.
const (
	maxResets   = 5
	resetWindow = time.Minute
)

// guestResets counts the resets of the execution's guest since the
// execution started; execution.mu guards it.
type guestResets struct {
	// count is how many times the guest reset and was started again, and
	// last when it last reset, on this host's clock.
	count uint32
	last  time.Time
	// recent are the times of the resets within the last resetWindow.
	recent []time.Time
}

// ended handles an init that ended on its own: it ends the execution, or
// restarts a guest that reset while its execution is to run.
func (e *execution) ended(ctx context.Context, as *hostv1.Assignment, st runtime.Status) {
	if e.endedByOOM(st) || st.Shutdown || as.Desired != hostv1.DesiredState_DESIRED_STATE_RUNNING {
		e.exit(ctx, as, st)
		return
	}
	if !e.countReset(time.Now()) {
		slog.Warn("the guest reset too often; its execution ends as a shutdown", "execution", e.id,
			"resets", maxResets, "within", resetWindow)
		e.exit(ctx, as, st)
		return
	}
	slog.Info("the guest reset; starting it again within its execution", "execution", e.id)
	e.restart(ctx, as)
}

// countReset records a reset at now and reports whether the guest may
// come back from it: false once it would be more than maxResets within
// resetWindow.
func (e *execution) countReset(now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := &e.resets
	for len(r.recent) > 0 && now.Sub(r.recent[0]) >= resetWindow {
		r.recent = r.recent[1:]
	}
	if len(r.recent) >= maxResets {
		return false
	}
	r.recent = append(r.recent, now)
	r.count++
	r.last = now
	return true
}

// restart brings back a guest that reset. The execution's RUNNING report
// is sent again at once without an observation of the guest, which is
// absent while the guest comes back; the driver releases the ended run
// (mounts, loop devices, cgroups; the slot stays) and boot starts the same
// execution again, reporting RUNNING with the guest's first observation,
// or FAILED as a start would.
func (e *execution) restart(ctx context.Context, as *hostv1.Assignment) {
	lock := e.agent.layerLock(as.LayerId)
	lock.Lock()
	defer lock.Unlock()
	e.mu.Lock()
	bootID := e.health.bootID
	e.mu.Unlock()
	e.setRunning(ctx, false) // ends the probes and drops their observation
	e.resendRunning()
	if _, err := e.agent.cfg.Driver.Stop(ctx, e.id, runtime.StopNormal, 0); err != nil {
		e.releaseSlot()
		e.fail(as, ctrlv1.FailureStage_FAILURE_STAGE_STARTING, fmt.Errorf("releasing the guest that reset: %w", err))
		return
	}
	layers, err := e.agent.deliver(ctx, as, func(uint64, uint64) {})
	if err != nil {
		e.releaseSlot()
		e.fail(as, ctrlv1.FailureStage_FAILURE_STAGE_STARTING, fmt.Errorf("template %s@%s: %w", as.Template.TemplateId, as.Template.Revision, err))
		return
	}
	e.boot(ctx, as, layers, e.lastReport().GetLayerContinued(), bootID)
}

// keepBoot makes bootID, when set, the boot the probes compare the
// guest's answers with: after a reset, the boot that started the
// execution, so that the guest is observed rebooted.
func (e *execution) keepBoot(bootID string) {
	if bootID == "" {
		return
	}
	e.mu.Lock()
	e.health.bootID = bootID
	e.mu.Unlock()
}

// withResets adds the execution's resets to an observation of its guest;
// nil stays nil (no observation while the guest comes back).
func (e *execution) withResets(g *ctrlv1.GuestObservation) *ctrlv1.GuestObservation {
	if g == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	g.RestartCount = e.resets.count
	if e.resets.count > 0 {
		g.LastResetAt = timestamppb.New(e.resets.last)
	}
	return g
}
