package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// TestGuestProbe: a running guest is reported RESPONDING; once it stops
// answering, UNRESPONSIVE with when and why, while the execution stays
// RUNNING; RESPONDING again once it answers. A process the OOM killer
// killed in a guest that answered afterwards does not make its later
// shutdown an OOM end.
func TestGuestProbe(t *testing.T) {
	e := newReconcilerEnv(t)
	e.runAgent(t, e.driver)
	as := e.assignment("ws_probe", 1, "lay_probe")
	mark := e.api.mark()
	e.api.assign(as.ExecutionId, as)
	r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	if g := r.Guest; g.GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING || g.Rebooted || g.Error != "" || g.UnresponsiveSince != nil {
		t.Errorf("first RUNNING report's guest: %v", g)
	}

	mark = e.api.mark()
	e.driver.NeverReady(as.ExecutionId)
	r = e.api.awaitReport(t, mark, as.ExecutionId, "UNRESPONSIVE", func(r *hostv1.ExecutionReport) bool {
		return r.Guest.GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE
	})
	if g := r.Guest; r.State != hostv1.ObservedState_OBSERVED_STATE_RUNNING || g.UnresponsiveSince == nil || g.Error == "" {
		t.Errorf("UNRESPONSIVE report: %v", r)
	}

	if !e.driver.OOMKill(as.ExecutionId) {
		t.Fatal("the execution does not run")
	}
	mark = e.api.mark()
	e.driver.Answer(as.ExecutionId)
	r = e.api.awaitReport(t, mark, as.ExecutionId, "RESPONDING", func(r *hostv1.ExecutionReport) bool {
		return r.Guest.GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING
	})
	if g := r.Guest; g.Error != "" || g.UnresponsiveSince != nil {
		t.Errorf("RESPONDING again: %v", g)
	}

	mark = e.api.mark()
	e.driver.Exit(as.ExecutionId, runtime.Status{ExitCode: -1, Shutdown: true})
	if r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_EXITED); r.OomKilled {
		t.Errorf("a shutdown after a survived OOM kill is reported as an OOM end: %v", r)
	}
	e.released(t, as.ExecutionId)
}

// TestGuestProbeRounds: a guest that takes the probe in and never answers
// holds up the probes of no other guest, and sits the rounds out while its
// probe waits, instead of piling probes up.
func TestGuestProbeRounds(t *testing.T) {
	e := newReconcilerEnv(t)
	e.probeTimeout = time.Hour // only the release ends the hung probe
	e.runAgent(t, e.driver)
	hung, other := e.assignment("ws_hung", 1, "lay_hung"), e.assignment("ws_other", 1, "lay_other")
	for _, as := range []*hostv1.Assignment{hung, other} {
		e.running(t, as)
	}
	release := e.driver.HangChecks(hung.ExecutionId)
	defer release()
	for e.driver.HangingChecks(hung.ExecutionId) == 0 {
		time.Sleep(time.Millisecond)
	}

	mark := e.api.mark()
	e.driver.NeverReady(other.ExecutionId)
	e.api.awaitReport(t, mark, other.ExecutionId, "UNRESPONSIVE beside a hung probe", func(r *hostv1.ExecutionReport) bool {
		return r.Guest.GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE
	})
	// That took rounds, each of which left the hung guest out.
	if n := e.driver.HangingChecks(hung.ExecutionId); n != 1 {
		t.Errorf("%d probes of the hung guest wait, want 1", n)
	}

	mark = e.api.mark()
	e.driver.NeverReady(hung.ExecutionId)
	release()
	e.api.awaitReport(t, mark, hung.ExecutionId, "UNRESPONSIVE once its probe ends", func(r *hostv1.ExecutionReport) bool {
		return r.Guest.GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE
	})
}

// TestGuestProbeOfEndedRun: a probe answered after its run ended (the
// guest reset meanwhile) changes nothing; the next run starts without an
// observation of its guest.
func TestGuestProbeOfEndedRun(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	e := &execution{running: true, runningCtx: ended, stopWaiting: cancel}
	e.setRunning(context.Background(), false)
	if e.guestChecked(ended, runtime.GuestCheck{ProbeErr: errors.New("the guest agent has ended")}, time.Now()) {
		t.Error("a probe of the ended run reports a change")
	}
	if g := e.guestObservation(); g != nil {
		t.Errorf("a probe of the ended run left an observation: %v", g)
	}
}
