package agent

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// The periodic probe of running guests.
const (
	// DefaultGuestProbeInterval is how often each running execution's
	// guest is probed unless Config.GuestProbeInterval says otherwise.
	DefaultGuestProbeInterval = 2 * time.Second
	// defaultProbeTimeout bounds one periodic probe: a guest that takes
	// longer is UNRESPONSIVE.
	defaultProbeTimeout = time.Second
)

// guestHealth is what the periodic probe knows of the guest of the running
// execution; execution.mu guards it.
type guestHealth struct {
	// obs is the latest observation; nil before the first probe.
	obs *ctrlv1.GuestObservation
	// bootID is the boot that answered the first probe of the execution.
	bootID string
	// oomKillsAtAnswer is the execution's OOM kill count read right after
	// the guest last answered.
	oomKillsAtAnswer uint64
	// memory judges the guest's memory pressure (memory.go).
	memory memoryWatch
}

// watchGuest probes the guest of the running execution now and then in
// every round of probeGuests until the execution no longer runs
// (setRunning ends the watch); each change of what the probe sees is
// reported at once. Call it once the execution is reported RUNNING; later
// calls are no-ops. first, when not nil, is a check the guest answered at
// checkedAt (a warm pool entry's, which found it ready): it stands for the
// probe made now, which would put one more round trip to the guest before
// the RUNNING report.
func (e *execution) watchGuest(first *runtime.GuestCheck, checkedAt time.Time) {
	if e.watching {
		return
	}
	e.watching = true
	ctx := e.runningCtx
	if first != nil {
		e.guestChecked(ctx, *first, checkedAt)
	} else {
		e.checkGuest(ctx)
	}
	e.agent.probes.watch(e, ctx)
}

// guestProbes are the running executions whose guests probeGuests probes,
// each with the context of its run.
type guestProbes struct {
	mu      sync.Mutex
	watched map[*execution]context.Context
}

// watch adds e for as long as ctx, its run's, lasts.
func (g *guestProbes) watch(e *execution, ctx context.Context) {
	g.mu.Lock()
	if g.watched == nil {
		g.watched = map[*execution]context.Context{}
	}
	g.watched[e] = ctx
	g.mu.Unlock()
	context.AfterFunc(ctx, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.watched[e] == ctx { // not a later run's
			delete(g.watched, e)
		}
	})
}

// probeGuests probes the guest of every watched execution every
// probeEvery, all in one round: one timer for the host instead of one per
// execution, and the probes run back to back, each in a goroutine of its
// own so that a guest that does not answer holds up no other. An
// execution whose last probe has not ended is left out of the round.
func (a *Agent) probeGuests(ctx context.Context) {
	t := time.NewTicker(a.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.probes.mu.Lock()
		for e, runCtx := range a.probes.watched {
			if e.probing.CompareAndSwap(false, true) {
				go func() {
					defer e.probing.Store(false)
					e.checkGuest(runCtx)
				}()
			}
		}
		a.probes.mu.Unlock()
	}
}

// checkGuest probes the guest once and reports a change.
func (e *execution) checkGuest(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, e.agent.probeTimeout)
	c, err := e.agent.cfg.Driver.CheckGuest(pctx, e.id)
	cancel()
	// An execution the driver no longer knows has ended: the exit watch
	// reports it. A run that ended meanwhile is neither recorded nor
	// relieved (guestChecked checks again, under the lock).
	if err != nil || ctx.Err() != nil {
		return
	}
	if e.guestChecked(ctx, c, time.Now()) {
		e.resendRunning()
	}
	if e.killIfSaturated(ctx) {
		e.resendRunning()
	}
}

// guestChecked records one probe made at now of the run whose context is
// ctx, and reports whether the observation changed (condition, error, boot
// or memory). A probe of a run that has ended changes nothing: made while
// a guest reset, its answer (the guest has ended) would otherwise stand
// for the guest that comes back. setRunning cancels the run's context
// before it drops the observation, so the check under e.mu cannot miss it.
func (e *execution) guestChecked(ctx context.Context, c runtime.GuestCheck, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	prev := e.health.obs
	obs := &ctrlv1.GuestObservation{}
	if c.ProbeErr == nil {
		obs.Condition = ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING
		if e.health.bootID == "" {
			e.health.bootID = c.BootID
		}
		obs.Rebooted = c.BootID != e.health.bootID
		e.health.oomKillsAtAnswer = c.OOMKills
	} else {
		obs.Condition = ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE
		obs.Error = c.ProbeErr.Error()
		obs.UnresponsiveSince = timestamppb.New(now)
		if prev.GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE {
			obs.UnresponsiveSince = prev.UnresponsiveSince
		}
		obs.Rebooted = prev.GetRebooted()
	}
	e.observeMemory(obs, c, now)
	e.health.obs = obs
	return prev == nil || !proto.Equal(prev, obs)
}

// guestObservation returns a copy of the latest observation of the guest;
// nil before the first probe.
func (e *execution) guestObservation() *ctrlv1.GuestObservation {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.health.obs == nil {
		return nil
	}
	return proto.CloneOf(e.health.obs)
}

// endedByOOM tells, from the status of an init that ended, whether the
// kernel's OOM killer ended it: it killed a process after the guest last
// answered. A process killed inside a guest that answered afterwards does
// not count, nor does one killed before the guest shut itself down (its
// poweroff ended it).
func (e *execution) endedByOOM(st runtime.Status) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !st.Shutdown && st.OOMKills > e.health.oomKillsAtAnswer
}
