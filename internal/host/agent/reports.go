package agent

import (
	"context"
	"errors"
	"log/slog"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// report queues a report for ctrl.
func (a *Agent) report(r *hostv1.ExecutionReport) {
	r.ObservedAt = timestamppb.Now()
	select {
	case a.reports <- r:
	default:
		slog.Warn("report queue full; the next heartbeat carries the state", "execution", r.ExecutionId)
	}
}

// sendReports sends queued reports and, every heartbeat, the last report
// of every execution again, so a restarted ctrl learns everything.
func (a *Agent) sendReports(ctx context.Context) {
	// Nothing goes before ctrl has taken this agent's registration: the
	// reports of one it refuses (another state under a name in use) would
	// renew the lease of the host it stands in for, which then never
	// turns LOST. What is reported meanwhile waits in the queue.
	select {
	case <-ctx.Done():
		return
	case <-a.registered:
	}
	every := a.heartbeatEvery()
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	// pending keeps reports in the order they were made until ctrl has
	// taken them; a failed call keeps them for the next attempt.
	var pending []*hostv1.ExecutionReport
	// pendingVolumes keeps only the latest report of each Volume: each is
	// complete.
	pendingVolumes := map[string]*hostv1.VolumeReport{}
	// pendingTransfers keeps the latest progress of each transfer.
	pendingTransfers := map[string]*hostv1.TransferReport{}
	for {
		if d := a.heartbeatEvery(); d != every {
			every = d
			ticker.Reset(every)
		}
		heartbeatDue := false
		select {
		case <-ctx.Done():
			return
		case r := <-a.reports:
			pending = append(pending, r)
		case r := <-a.volumeReports:
			pendingVolumes[r.VolumeId] = r
		case r := <-a.transferReports:
			pendingTransfers[r.TransferId] = r
		case <-ticker.C:
			heartbeatDue = true
		case <-a.registeredNow:
			heartbeatDue = true
		}
	drain:
		for {
			select {
			case r := <-a.reports:
				pending = append(pending, r)
			case r := <-a.volumeReports:
				pendingVolumes[r.VolumeId] = r
			case r := <-a.transferReports:
				pendingTransfers[r.TransferId] = r
			default:
				break drain
			}
		}
		if heartbeatDue {
			// After everything queued, so nothing older follows it.
			a.mu.Lock()
			for _, e := range a.execs {
				if r := e.lastReport(); r != nil {
					pending = append(pending, r)
				}
			}
			a.mu.Unlock()
			for _, r := range a.vols.latest() {
				pendingVolumes[r.VolumeId] = r
			}
		}
		// A heartbeat is sent even with nothing to say: it renews the
		// host's lease.
		if !heartbeatDue && len(pending) == 0 && len(pendingVolumes) == 0 && len(pendingTransfers) == 0 {
			continue
		}
		req := &hostv1.ReportExecutionsRequest{HostId: a.cfg.HostID, StateId: a.stateID, Reports: pending}
		for _, r := range pendingVolumes {
			req.Volumes = append(req.Volumes, r)
		}
		for _, r := range pendingTransfers {
			req.Transfers = append(req.Transfers, r)
		}
		callCtx, cancel := context.WithTimeout(ctx, reportTimeout)
		sent := time.Now()
		_, err := a.cfg.Client.ReportExecutions(callCtx, connect.NewRequest(req))
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				slog.Warn("report to ctrl failed; retrying with the next report or heartbeat", "err", err)
			}
			if len(pending) > maxPendingReports {
				pending = pending[len(pending)-maxPendingReports:]
			}
			continue
		}
		a.heard(sent)
		pending = nil
		clear(pendingVolumes)
		clear(pendingTransfers)
	}
}

// heartbeatEvery is how often every execution's state is reported again:
// heartbeat, or more often when ctrl's lease asks for it.
func (a *Agent) heartbeatEvery() time.Duration {
	if d := time.Duration(a.reportInterval.Load()); d > 0 && d < heartbeat {
		return d
	}
	return heartbeat
}

// lastReport returns a copy of the last report about this execution; nil
// before the first.
func (e *execution) lastReport() *hostv1.ExecutionReport {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last == nil {
		return nil
	}
	return proto.CloneOf(e.last)
}

// reportedRunning reports whether the last report about this execution
// was RUNNING at generation; unlike lastReport it copies nothing, for the
// gateway's check of every call.
func (e *execution) reportedRunning(generation uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last != nil && e.last.State == hostv1.ObservedState_OBSERVED_STATE_RUNNING && e.last.Generation == generation
}

// report records and sends a report about this execution.
func (e *execution) report(as *hostv1.Assignment, r *hostv1.ExecutionReport) {
	e.reportMu.Lock()
	defer e.reportMu.Unlock()
	e.send(as, r)
}

// send records and sends a report; reportMu is held.
func (e *execution) send(as *hostv1.Assignment, r *hostv1.ExecutionReport) {
	r.ExecutionId, r.WorkspaceId, r.Generation = e.id, as.WorkspaceId, as.Generation
	if r.State == hostv1.ObservedState_OBSERVED_STATE_RUNNING {
		r.Guest = e.withResets(e.guestObservation())
	}
	e.mu.Lock()
	e.last = proto.CloneOf(r)
	e.mu.Unlock()
	e.agent.report(r)
}

// reasonOf classifies a failure for ctrl.
func reasonOf(err error) ctrlv1.FailureReason {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT
	case errors.Is(err, context.Canceled):
		return ctrlv1.FailureReason_FAILURE_REASON_CANCELLED
	case errors.Is(err, imagestore.ErrUnsupportedPlatform), errors.Is(err, imagestore.ErrLayerTooLarge):
		// No way to make this template usable on this host.
		return ctrlv1.FailureReason_FAILURE_REASON_UNSUPPORTED
	case errors.Is(err, syscall.ENOSPC):
		return ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED
	case errors.As(err, new(damagedVolumeError)):
		return ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE
	}
	return ctrlv1.FailureReason_FAILURE_REASON_INTERNAL
}
