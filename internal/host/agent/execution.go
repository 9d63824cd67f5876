package agent

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/diskimage"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// execution converges one execution.
type execution struct {
	agent  *Agent
	id     string
	cancel context.CancelFunc
	wake   chan struct{}
	// workspace is the workspace of its first assignment (Agent.assign);
	// under the agent's lock.
	workspace string

	mu      sync.Mutex
	desired *hostv1.Assignment
	known   bool // desired has been set at least once
	last    *hostv1.ExecutionReport
	slot    *netslot.Slot // the network slot while the execution runs
	health  guestHealth   // the periodic probe's view of the running guest
	resets  guestResets   // the guest's resets since the execution started

	// reportMu orders reports: a slot's change never re-sends RUNNING
	// after the execution reported something else.
	reportMu sync.Mutex

	// exited receives the status of init when it ends on its own.
	exited chan runtime.Status

	// Owned by run.
	running bool
	// stopWaiting ends the exit watch and the probes of the running
	// execution; runningCtx is their context.
	stopWaiting context.CancelFunc
	runningCtx  context.Context
	// watching is true once the running execution's guest is probed.
	watching bool
	// probing is true while a round of probeGuests probes the guest.
	probing atomic.Bool
	// pendingExit holds an exit seen before any assignment named the
	// execution.
	pendingExit *runtime.Status
	// memory is the memory limit the running execution has; zero when
	// unknown (adopted after a restart).
	memory uint64
	// hurry, under mu while a NORMAL stop runs, ends its grace: a FORCE
	// stop or a delete assigned meanwhile ends the execution at once.
	hurry context.CancelFunc
}

// escalates reports whether as ends the execution at once: a FORCE stop
// or a delete.
func escalates(as *hostv1.Assignment) bool {
	return as.GetDesired() == hostv1.DesiredState_DESIRED_STATE_DELETED ||
		as.GetDesired() == hostv1.DesiredState_DESIRED_STATE_STOPPED && as.GetStop().GetMode() == ctrlv1.StopMode_STOP_MODE_FORCE
}

// setRunning records whether the execution runs and, while it does,
// watches for its init to end (the driver waits on a pidfd: no polling of
// the runtime). Each run starts without an observation of its guest.
func (e *execution) setRunning(ctx context.Context, running bool) {
	if e.stopWaiting != nil {
		e.stopWaiting()
		e.stopWaiting, e.runningCtx = nil, nil
	}
	e.running, e.watching = running, false
	e.mu.Lock()
	e.health = guestHealth{}
	e.mu.Unlock()
	if !running {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	e.stopWaiting, e.runningCtx = cancel, wctx
	go func() {
		st, err := e.agent.cfg.Driver.Wait(wctx, e.id)
		if err != nil || wctx.Err() != nil {
			return
		}
		// The run's probes end with its init: one still running would
		// find the guest gone and record it UNRESPONSIVE once the reset
		// is counted, before the restart drops the run's observation.
		cancel()
		select {
		case e.exited <- st:
		default:
		}
	}()
}

func (e *execution) set(as *hostv1.Assignment) {
	e.mu.Lock()
	e.desired, e.known = as, true
	if e.hurry != nil && escalates(as) {
		e.hurry()
	}
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *execution) get() (*hostv1.Assignment, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.desired, e.known
}

func (e *execution) run(ctx context.Context) {
	defer e.cancel()
	for {
		as, known := e.get()
		if known && as == nil {
			// No longer assigned: stop (keeping the layer; Stop is
			// idempotent and also releases leftovers) and forget, unless
			// it was assigned again meanwhile or the stop failed.
			if e.stop(ctx, nil, runtime.StopNormal) && e.agent.forgetIfUnassigned(e) {
				return
			}
		}
		if as != nil && e.pendingExit != nil {
			st := *e.pendingExit
			e.pendingExit = nil
			e.ended(ctx, as, st)
		}
		if as != nil {
			e.step(ctx, as)
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case st := <-e.exited:
			switch {
			case e.running && as != nil:
				e.ended(ctx, as, st)
			case e.running:
				// Adopted after a restart, before ctrl's first assignment:
				// report the exit once it is known what it served.
				e.pendingExit = &st
			}
		case <-time.After(checkEvery):
		}
	}
}

// step takes one action toward the assignment.
func (e *execution) step(ctx context.Context, as *hostv1.Assignment) {
	switch as.Desired {
	case hostv1.DesiredState_DESIRED_STATE_RUNNING:
		if !e.running {
			// A failed or exited execution is never started again on its
			// own: ctrl starts another one (a new execution ID).
			if last := e.lastReport(); last != nil && (last.State == hostv1.ObservedState_OBSERVED_STATE_FAILED ||
				last.State == hostv1.ObservedState_OBSERVED_STATE_EXITED) {
				return
			}
			e.start(ctx, as)
			return
		}
		e.observe(ctx, as)
	case hostv1.DesiredState_DESIRED_STATE_STOPPED:
		mode := runtime.StopNormal
		if as.GetStop().GetMode() == ctrlv1.StopMode_STOP_MODE_FORCE {
			mode = runtime.StopForce
		}
		if last := e.lastReport(); e.running || last == nil || last.State != hostv1.ObservedState_OBSERVED_STATE_STOPPED {
			e.stop(ctx, as, mode)
		}
	case hostv1.DesiredState_DESIRED_STATE_DELETED:
		if last := e.lastReport(); last == nil || last.State != hostv1.ObservedState_OBSERVED_STATE_DELETED {
			e.delete(ctx, as)
		}
	}
}

// observe reports a running execution that has not been reported as
// running for this assignment yet (one adopted after a restart).
func (e *execution) observe(ctx context.Context, as *hostv1.Assignment) {
	e.applyNetwork(as)
	e.applyMemory(ctx, as)
	if last := e.lastReport(); last != nil && last.State == hostv1.ObservedState_OBSERVED_STATE_RUNNING && last.Generation == as.Generation {
		return
	}
	if e.agent.cfg.Driver.Probe(ctx, e.id) == nil {
		e.watchGuest(nil, time.Time{})
		e.reserveAdopted(as)
		capacity, _ := e.agent.cfg.Layers.LayerCapacity(e.agent.layerPath(as.LayerId))
		e.report(as, e.withNetwork(&hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_RUNNING,
			LayerCapacityBytes: &capacity, LayerContinued: true}))
	}
}

// reserveAdopted holds the layer and Volume images of an execution adopted
// after a restart in full on the host's disk (see ReserveLayer): a build
// before reservations left those it started sparse. The guest runs on
// whatever the disk says; a failure is logged.
func (e *execution) reserveAdopted(as *hostv1.Assignment) {
	if err := e.agent.cfg.Layers.ReserveLayer(e.agent.layerPath(as.LayerId)); err != nil {
		slog.Warn("the layer of an adopted execution is not held in full: a full host disk can fail its guest's writes", "execution", e.id, "err", err)
	}
	v := as.GetVolume()
	if v == nil {
		return
	}
	image, err := e.agent.vols.path(v.StoragePool, v.VolumeId)
	if err == nil {
		err = diskimage.Reserve(image)
	}
	if err != nil {
		slog.Warn("the Volume of an adopted execution is not held in full: a full host disk can fail its guest's writes", "execution", e.id, "volume", v.VolumeId, "err", err)
	}
}

// applyMemory gives the running execution the memory its assignment
// says (UpdateWorkspaceMemory raises it live).
func (e *execution) applyMemory(ctx context.Context, as *hostv1.Assignment) {
	want := as.Resources.GetMemoryBytes()
	if want == 0 || want == e.memory {
		return
	}
	if err := e.agent.cfg.Driver.SetMemory(ctx, e.id, want); err != nil {
		slog.Error("changing the memory of a running execution", "execution", e.id, "bytes", want, "err", err)
		return
	}
	e.memory = want
}
