package agent

import (
	"errors"
	"slices"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// awaitRestarts returns the first RUNNING report of id, from the from-th
// on, whose guest observation counts n restarts.
func (h *hostAPI) awaitRestarts(t *testing.T, from int, id string, n uint32) *hostv1.ExecutionReport {
	t.Helper()
	return h.awaitReport(t, from, id, "RUNNING after a reset", func(r *hostv1.ExecutionReport) bool {
		return r.State == hostv1.ObservedState_OBSERVED_STATE_RUNNING && r.Guest.GetRestartCount() == n
	})
}

// TestReconcilerGuestReset: a guest whose init ends without shutting down
// comes back within its execution: the same generation, spec (layer,
// namespace) and slot, started again by the driver; RUNNING is reported
// at once without a guest observation, then with one that counts the
// reset and says the guest rebooted. A shutdown ends the execution, and
// the workspace's next execution counts from zero.
func TestReconcilerGuestReset(t *testing.T) {
	e := newReconcilerEnv(t)
	a, _ := e.runAgent(t, e.driver)
	as := e.assignment("ws_reset", 1, "lay_reset")
	id := as.ExecutionId
	if r := e.running(t, as); r.Guest.GetRestartCount() != 0 || r.Guest.GetLastResetAt() != nil || r.Guest.GetRebooted() {
		t.Errorf("first RUNNING report's guest: %v", r.Guest)
	}
	before, _, _ := e.driver.Spec(id)
	a.mu.Lock()
	slot := a.execs[id].getSlot()
	a.mu.Unlock()

	mark := e.api.mark()
	resetAt := time.Now()
	if !e.driver.Exit(id, runtime.Status{ExitCode: -1}) {
		t.Fatal("the execution does not run")
	}
	e.api.awaitReport(t, mark, id, "RUNNING without a guest observation", func(r *hostv1.ExecutionReport) bool {
		return r.State == hostv1.ObservedState_OBSERVED_STATE_RUNNING && r.Guest == nil
	})
	r := e.api.awaitRestarts(t, mark, id, 1)
	if g := r.Guest; g.Condition != ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING || !g.Rebooted ||
		g.LastResetAt == nil || g.LastResetAt.AsTime().Before(resetAt) || r.Generation != 1 ||
		r.GetNetwork().GetStatus().GetAppliedRevision() != 1 {
		t.Errorf("RUNNING report after the reset: %v", r)
	}
	if n := e.driver.Starts(id); n != 2 {
		t.Errorf("started %d times, want 2", n)
	}
	after, _, _ := e.driver.Spec(id)
	if after.LayerImage != before.LayerImage || after.NetNS != before.NetNS || !slices.Equal(after.Layers, before.Layers) {
		t.Errorf("started again with %+v, first with %+v", after, before)
	}
	a.mu.Lock()
	same := a.execs[id].getSlot() == slot
	a.mu.Unlock()
	if !same {
		t.Error("the guest came back in another network slot")
	}
	if got := e.api.states(id); !slices.Equal(got, []hostv1.ObservedState{hostv1.ObservedState_OBSERVED_STATE_DELIVERING,
		hostv1.ObservedState_OBSERVED_STATE_STARTING, hostv1.ObservedState_OBSERVED_STATE_RUNNING}) {
		t.Errorf("reported %v", got)
	}

	// A second reset counts on.
	mark = e.api.mark()
	e.driver.Exit(id, runtime.Status{ExitCode: 137, Signal: "KILL"})
	if r := e.api.awaitRestarts(t, mark, id, 2); !r.Guest.Rebooted {
		t.Errorf("RUNNING report after the second reset: %v", r)
	}

	mark = e.api.mark()
	e.driver.Exit(id, runtime.Status{ExitCode: -1, Shutdown: true})
	if r := e.api.await(t, mark, id, hostv1.ObservedState_OBSERVED_STATE_EXITED); r.OomKilled {
		t.Errorf("EXITED report of a shutdown: %v", r)
	}
	e.released(t, id)
	if n := e.driver.Starts(id); n != 3 {
		t.Errorf("started %d times, want 3", n)
	}

	e.api.assign(id, nil)
	next := e.assignment("ws_reset", 2, "lay_reset")
	if r := e.running(t, next); r.Guest.GetRestartCount() != 0 || r.Guest.GetLastResetAt() != nil || r.Guest.GetRebooted() {
		t.Errorf("the next execution's guest: %v", r.Guest)
	}
}

// TestReconcilerResetLoop: a guest comes back from maxResets resets in a
// row; the next one within resetWindow ends its execution as a shutdown.
func TestReconcilerResetLoop(t *testing.T) {
	e := newReconcilerEnv(t)
	e.runAgent(t, e.driver)
	as := e.assignment("ws_loop", 1, "lay_loop")
	id := as.ExecutionId
	e.running(t, as)
	for n := uint32(1); n <= maxResets; n++ {
		mark := e.api.mark()
		e.driver.Exit(id, runtime.Status{ExitCode: -1})
		e.api.awaitRestarts(t, mark, id, n)
	}
	mark := e.api.mark()
	e.driver.Exit(id, runtime.Status{ExitCode: -1})
	if r := e.api.await(t, mark, id, hostv1.ObservedState_OBSERVED_STATE_EXITED); r.OomKilled {
		t.Errorf("EXITED report of a reset loop: %v", r)
	}
	e.released(t, id)
	if n := e.driver.Starts(id); n != maxResets+1 {
		t.Errorf("started %d times, want %d", n, maxResets+1)
	}
}

// TestReconcilerResetFails: a guest that cannot be started again after a
// reset ends its execution FAILED at stage STARTING, released. (An OOM
// end is no reset: TestReconcilerExit.)
func TestReconcilerResetFails(t *testing.T) {
	e := newReconcilerEnv(t)
	e.runAgent(t, e.driver)
	as := e.assignment("ws_refused", 1, "lay_refused")
	e.running(t, as)
	e.driver.FailStart(as.ExecutionId, errors.New("runtime refused"))
	mark := e.api.mark()
	e.driver.Exit(as.ExecutionId, runtime.Status{ExitCode: -1})
	r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_FAILED)
	if r.FailureStage != ctrlv1.FailureStage_FAILURE_STAGE_STARTING || r.FailureMessage == "" {
		t.Errorf("FAILED report: %v", r)
	}
	e.released(t, as.ExecutionId)

}
