package workspaces

// This file is the state machine: how requests begin a stop or a
// deletion, and how what a host reports of an execution moves its
// workspace.

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// beginStop moves a record to STOPPING with the stop it names.
func (s *Service) beginStop(r *record, cause ctrlv1.StopCause, mode ctrlv1.StopMode, commandID string) {
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
	r.ws.LastStop = &ctrlv1.WorkspaceStop{Cause: cause, Mode: mode, CommandId: commandID, RequestedAt: timestamppb.New(s.Now.UTC())}
	r.ws.Delivery = nil
	r.book.Desired = DesiredStopped
	r.book.StopMode, r.book.StopCommand, r.book.StopCause = mode, commandID, cause
}

// beginDelete moves a record to DELETING; a workspace on no host is
// DELETED at once.
func (s *Service) beginDelete(ctx context.Context, tx store.Tx, r *record, cause ctrlv1.StopCause) error {
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING
	r.ws.LastStop = nil
	r.ws.Delivery = nil
	r.book.Desired = DesiredDeleted
	r.book.StopCause = cause
	// Decided now: a host may finish creating the Volume before the
	// deletion completes, but none of the workspace's launches ran on it.
	v, err := boundRecord(ctx, tx, r)
	if err != nil {
		return err
	}
	r.book.VolumeUncreated = v != nil && v.Uncreated(r.row.ID)
	if r.row.HostID == "" {
		return s.finishDelete(ctx, tx, r)
	}
	if lost, err := hostLost(ctx, tx, r.row.HostID); err != nil || !lost {
		return err
	}
	// Its host stopped reporting: nothing there can be waited for.
	r.book.Unknown = 0
	return s.finishDelete(ctx, tx, r)
}

// finishDelete marks a record DELETED, releasing its host reservation and
// its policy references.
func (s *Service) finishDelete(ctx context.Context, tx store.Tx, r *record) error {
	now := s.Now.UTC()
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
	r.ws.Delivery, r.ws.GuestObservation, r.ws.NetworkPolicyStatus = nil, nil, nil
	r.row.DeletedAt = now
	r.row.HostID = ""
	if err := s.releaseVolume(ctx, tx, r, r.ws.Spec.GetVolume().GetDeleteWithWorkspace() && !r.failedRestore()); err != nil {
		return err
	}
	return tx.SetPolicyReferences(ctx, r.row.ProjectID, r.row.ID, nil)
}

// apply moves a workspace by what its execution reports.
func (s *Service) apply(ctx context.Context, tx store.Tx, r *record, rep *hostv1.ExecutionReport) error {
	now := s.Now.UTC()
	switch rep.State {
	case hostv1.ObservedState_OBSERVED_STATE_DELIVERING:
		delivering(r, rep, now)
	case hostv1.ObservedState_OBSERVED_STATE_STARTING:
		delivered(r, now)
	case hostv1.ObservedState_OBSERVED_STATE_RUNNING:
		running(r, rep, now)
		return nil // the network stays: this execution is current
	case hostv1.ObservedState_OBSERVED_STATE_STOPPED:
		if r.book.Desired == DesiredStopped && r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING {
			stopped(r, rep, now)
		}
	case hostv1.ObservedState_OBSERVED_STATE_EXITED:
		if r.book.Desired == DesiredRunning && r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			// The guest ended on its own: release the execution as a
			// forced stop so that the caller can start it again.
			s.beginStop(r, exitCause(rep.OomKilled), ctrlv1.StopMode_STOP_MODE_FORCE, "")
		}
	case hostv1.ObservedState_OBSERVED_STATE_DELETED:
		if r.book.Desired == DesiredDeleted {
			return s.finishDelete(ctx, tx, r)
		}
	case hostv1.ObservedState_OBSERVED_STATE_FAILED:
		if r.book.Desired == DesiredDeleted {
			return nil // the host retries the deletion; DELETING stays
		}
		if err := failed(ctx, tx, r, rep, now); err != nil {
			return err
		}
	}
	switch r.ws.State {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING:
	default:
		clearNetwork(r.ws) // no current execution
		r.ws.GuestObservation = nil
	}
	return nil
}

// nextExecution makes the execution assigned to a workspace that starts a
// new one: of the next generation, or the next attempt at it when a start
// of that generation failed. Each execution has a data-plane key of its
// own, so that no host an earlier one was assigned to (one the workspace
// moved off, or one whose token was revoked since) can sign a session
// token for it. Callers see nothing of it: the sessions of earlier
// generations fail by their generation already, and none is issued for
// this one before it runs.
func nextExecution(r *record) {
	if r.book.Target == r.ws.Generation+1 {
		r.book.Attempt++ // a retry of a start that failed
	} else {
		r.book.Target, r.book.Attempt = r.ws.Generation+1, 0
	}
	r.book.DataPlane = DataPlane{Key: NewDataPlaneKey()}
}

// starting reports whether a workspace in state waits for its execution
// to run.
func starting(state ctrlv1.WorkspaceState) bool {
	return state == ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING || state == ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
}

// delivering records the template delivery's progress of a starting
// workspace.
func delivering(r *record, rep *hostv1.ExecutionReport, now time.Time) {
	if !starting(r.ws.State) {
		return
	}
	d := observeDelivery(r, now)
	d.State = ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_NOT_READY
	d.Reason = ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_DISTRIBUTING
	d.BytesTotal, d.BytesDelivered = rep.DeliveryBytesTotal, rep.DeliveryBytesDelivered
}

// delivered records that a starting workspace's template is usable on its
// host: the host has gone on to start the execution.
func delivered(r *record, now time.Time) {
	if !starting(r.ws.State) {
		return
	}
	d := observeDelivery(r, now)
	d.State, d.Reason, d.Message = ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_READY, 0, ""
	d.BytesDelivered = d.BytesTotal
}

// observeDelivery returns the workspace's delivery observation, a new one
// when it has none, observed now.
func observeDelivery(r *record, now time.Time) *ctrlv1.TemplateDeliveryObservation {
	d := r.ws.Delivery
	if d == nil {
		d = &ctrlv1.TemplateDeliveryObservation{StartedAt: timestamppb.New(now)}
		r.ws.Delivery = d
	}
	d.ObservedAt = timestamppb.New(now)
	return d
}

// deliveryFailed keeps the delivery observation of a start that failed
// before its template was usable, saying why: the host lacks what the
// workspace is bound to (CAPABILITY_MISMATCH), cannot take the template
// at all (NO_SUPPORTED_PATH), or failed preparing it (PREPARATION_FAILED,
// with the host's message). A start that failed later has none.
func deliveryFailed(r *record, rep *hostv1.ExecutionReport, reason ctrlv1.FailureReason, now time.Time) {
	d := r.ws.Delivery
	if d.GetState() == ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_READY ||
		d == nil && reason != ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE {
		r.ws.Delivery = nil
		return
	}
	d = observeDelivery(r, now)
	d.State, d.Message = ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_NOT_READY, rep.FailureMessage
	switch reason {
	case ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE:
		d.Reason = ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_CAPABILITY_MISMATCH
	case ctrlv1.FailureReason_FAILURE_REASON_UNSUPPORTED:
		d.Reason = ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_NO_SUPPORTED_PATH
	default:
		d.Reason = ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_PREPARATION_FAILED
	}
}

// deliveryStale marks the delivery observation of a workspace whose host
// stopped reporting: UNKNOWN, OBSERVATION_STALE, as of the host's last
// report.
func deliveryStale(r *record) {
	if d := r.ws.Delivery; d != nil {
		d.State, d.Reason = ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_UNKNOWN, ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_OBSERVATION_STALE
	}
}

// running records a running execution's network and guest, and makes a workspace
// that waited for it AVAILABLE at the execution's generation.
func running(r *record, rep *hostv1.ExecutionReport, now time.Time) {
	if r.book.Desired != DesiredRunning {
		return
	}
	applyNetwork(r.ws, rep.Network, now)
	applyGuest(r.ws, rep.Guest, now)
	if !starting(r.ws.State) && r.ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		return
	}
	first := r.book.Target == 1
	cont := &continuity{kind: ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_CONTINUED}
	switch {
	case first && r.book.Restore != nil:
		// A restored layer holds the exported workspace's files.
	case first:
		cont = &continuity{kind: ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET, reason: ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_FIRST_START}
	case !rep.LayerContinued:
		cont = &continuity{kind: ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET, reason: ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_LAYER_UNAVAILABLE}
	}
	if r.ws.Generation != r.book.Target {
		// Tokens of earlier generations fail by their generation.
		r.book.DataPlane.Revoked = nil
	}
	if len(r.book.DataPlane.Key) == 0 { // stored before keys came with creation
		r.book.DataPlane.Key = NewDataPlaneKey()
	}
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
	r.ws.Generation = r.book.Target
	r.ws.Delivery, r.ws.Failure = nil, nil
	r.ws.RetentionTiers = retentionTiers(cont, rep.GetLayerCapacityBytes(), rep.LayerCapacityBytes != nil)
	r.ws.Reestablish = nil
	if !first {
		r.ws.Reestablish = []ctrlv1.ReestablishRequirement{
			ctrlv1.ReestablishRequirement_REESTABLISH_REQUIREMENT_DATA_PLANE_SESSION,
			ctrlv1.ReestablishRequirement_REESTABLISH_REQUIREMENT_PROCESS,
		}
	}
}

// stopped completes a stop: STOPPED, with the stop's durability and the
// layer's capacity. A FORCE stop is never confirmed, even when the host
// finished the NORMAL one it escalated with a sync.
func stopped(r *record, rep *hostv1.ExecutionReport, now time.Time) {
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
	if ls := r.ws.LastStop; ls != nil {
		ls.Durability = rep.StopDurability
		if ls.Mode == ctrlv1.StopMode_STOP_MODE_FORCE {
			ls.Durability = ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED
		}
		ls.CompletedAt = timestamppb.New(now)
	}
	layerKept(r, rep)
}

// failed makes the workspace FAILED with the reason and stage reported
// (INTERNAL at STARTING when the host names none; VOLUME_LOST when its
// Volume's pool was declared lost meanwhile).
func failed(ctx context.Context, tx store.Tx, r *record, rep *hostv1.ExecutionReport, now time.Time) error {
	stage := rep.FailureStage
	if stage == ctrlv1.FailureStage_FAILURE_STAGE_UNSPECIFIED {
		stage = ctrlv1.FailureStage_FAILURE_STAGE_STARTING
	}
	reason := rep.FailureReason
	if reason == ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		reason = ctrlv1.FailureReason_FAILURE_REASON_INTERNAL
	}
	if lost, err := volumeLost(ctx, tx, r); err != nil {
		return err
	} else if lost {
		// A start already under way when the pool was declared lost.
		reason = ctrlv1.FailureReason_FAILURE_REASON_VOLUME_LOST
	}
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
	r.ws.Failure = &ctrlv1.WorkspaceFailure{Reason: reason, Stage: stage, Message: rep.FailureMessage, FailedAt: timestamppb.New(now)}
	deliveryFailed(r, rep, reason, now)
	r.book.Desired = DesiredStopped
	return nil
}

// layerKept records the layer's capacity in the BEST_EFFORT tier after a
// stop.
func layerKept(r *record, rep *hostv1.ExecutionReport) {
	if rep.LayerCapacityBytes == nil {
		return
	}
	for _, t := range r.ws.RetentionTiers {
		if t.Kind == ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT {
			t.CapacityBytes = rep.LayerCapacityBytes
		}
	}
}
