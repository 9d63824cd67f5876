package agent

import (
	"context"
	"log/slog"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// exit releases an execution whose init ended on its own and that does
// not come back (see ended), and tells ctrl.
func (e *execution) exit(ctx context.Context, as *hostv1.Assignment, st runtime.Status) {
	oom := e.endedByOOM(st)
	e.agent.cfg.Driver.Stop(ctx, e.id, runtime.StopForce, 0)
	e.releaseSlot()
	e.setRunning(ctx, false)
	e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_EXITED, OomKilled: oom})
}

// stop ends the execution and reports true once nothing of it runs.
func (e *execution) stop(ctx context.Context, as *hostv1.Assignment, mode runtime.StopMode) bool {
	var layerID string
	if as != nil {
		layerID = as.LayerId
		lock := e.agent.layerLock(layerID)
		lock.Lock()
		defer lock.Unlock()
		e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_STOPPING})
	}
	e.setRunning(ctx, false) // a deliberate stop is not an exit
	res, escalated, err := e.stopHurried(ctx, mode)
	if err == nil {
		err = e.releaseSlot()
	}
	if err != nil {
		slog.Error("stop failed", "execution", e.id, "err", err)
		if as != nil {
			e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
				FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_STOPPING, FailureReason: reasonOf(err), FailureMessage: e.agent.publicMessage(err)})
		}
		return false
	}
	if as == nil {
		return true
	}
	durability := ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED
	if res.Confirmed {
		durability = ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED
	}
	r := &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_STOPPED,
		StopDurability: durability, StopCommandId: as.GetStop().GetCommandId()}
	if cur := e.current(); escalated && cur.GetStop() != nil {
		r.StopCommandId = cur.GetStop().GetCommandId() // the FORCE stop ended it
	}
	if capacity, err := e.agent.cfg.Layers.LayerCapacity(e.agent.layerPath(layerID)); err == nil {
		r.LayerCapacityBytes = &capacity
	}
	e.report(as, r)
	return true
}

// stopHurried stops the execution in mode; a NORMAL stop whose grace a
// FORCE stop or a delete ends (execution.hurry) goes on as a FORCE stop,
// which releases what the cut one left, and reports escalated.
func (e *execution) stopHurried(ctx context.Context, mode runtime.StopMode) (res runtime.StopResult, escalated bool, err error) {
	if mode != runtime.StopNormal {
		res, err = e.agent.cfg.Driver.Stop(ctx, e.id, mode, e.agent.stopGrace)
		return res, false, err
	}
	graceCtx, hurry := context.WithCancel(ctx)
	defer hurry()
	e.mu.Lock()
	e.hurry = hurry
	if escalates(e.desired) {
		hurry()
	}
	e.mu.Unlock()
	res, err = e.agent.cfg.Driver.Stop(graceCtx, e.id, mode, e.agent.stopGrace)
	e.mu.Lock()
	e.hurry = nil
	e.mu.Unlock()
	if err != nil && graceCtx.Err() != nil && ctx.Err() == nil {
		slog.Info("a stop's grace ended early: a FORCE stop or a delete came", "execution", e.id)
		res, err = e.agent.cfg.Driver.Stop(ctx, e.id, runtime.StopForce, 0)
		return res, true, err
	}
	return res, false, err
}

// current returns the execution's assignment as it is now.
func (e *execution) current() *hostv1.Assignment {
	as, _ := e.get()
	return as
}

func (e *execution) delete(ctx context.Context, as *hostv1.Assignment) {
	lock := e.agent.layerLock(as.LayerId)
	lock.Lock()
	defer lock.Unlock()
	e.setRunning(ctx, false)
	_, err := e.agent.cfg.Driver.Stop(ctx, e.id, runtime.StopForce, 0)
	if err == nil {
		err = e.releaseSlot()
	}
	if err != nil {
		e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
			FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_DELETING, FailureReason: reasonOf(err), FailureMessage: e.agent.publicMessage(err)})
		return
	}
	if err := e.agent.cfg.Layers.DeleteLayer(e.agent.layerPath(as.LayerId)); err != nil {
		e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
			FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_DELETING, FailureReason: reasonOf(err), FailureMessage: e.agent.publicMessage(err)})
		return
	}
	e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_DELETED})
}
