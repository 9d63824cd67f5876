package volumes

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// This file is the host-facing half: the volume assignments of a host and
// folding its volume reports back into Volumes.

// observationRefresh is how often an unchanged observation's observed_at
// is moved forward.
const observationRefresh = 30 * time.Second

// HostAssignments returns what ctrl wants of the Volumes a host holds.
func HostAssignments(ctx context.Context, tx store.Tx, hostID string) ([]*hostv1.VolumeAssignment, error) {
	rows, err := tx.HostVolumes(ctx, hostID)
	if err != nil {
		return nil, err
	}
	var out []*hostv1.VolumeAssignment
	for _, row := range rows {
		r, err := decode(row)
		if err != nil {
			return nil, err
		}
		a := &hostv1.VolumeAssignment{
			VolumeId: r.V.VolumeId, StoragePool: r.V.Spec.StoragePool, CapacityBytes: r.Book.Target,
			Desired: hostv1.VolumeDesired_VOLUME_DESIRED_PRESENT, FilesystemUuid: r.Book.UUID,
		}
		switch r.V.State {
		case ctrlv1.VolumeState_VOLUME_STATE_CREATING:
			a.Create = true
			a.Restoring = r.Book.Restoring
		case ctrlv1.VolumeState_VOLUME_STATE_DELETING:
			a.Desired = hostv1.VolumeDesired_VOLUME_DESIRED_DELETED
		case ctrlv1.VolumeState_VOLUME_STATE_FAILED, ctrlv1.VolumeState_VOLUME_STATE_LOST:
			continue // nothing for the host to do until a command says so
		}
		out = append(out, a)
	}
	return out, nil
}

// Report folds a host's volume reports into the Volumes it holds and
// returns the workspaces bound to those that changed, whose retention
// tiers show them. Reports of Volumes the host does not hold are ignored.
func (s *Service) Report(ctx context.Context, tx store.Tx, hostID string, reports []*hostv1.VolumeReport) (changed []string, err error) {
	if len(reports) == 0 {
		return nil, nil
	}
	rows, err := tx.HostVolumes(ctx, hostID)
	if err != nil {
		return nil, err
	}
	byID := resource.ByID(rows, func(row store.Volume) string { return row.ID })
	for _, rep := range reports {
		row, ok := byID[rep.VolumeId]
		if !ok {
			continue
		}
		r, err := decode(row)
		if err != nil {
			return nil, err
		}
		before := proto.CloneOf(r.V)
		bookBefore := r.Book
		s.apply(r, rep)
		if proto.Equal(before, r.V) && bookBefore == r.Book {
			continue
		}
		// An observation alone is diagnostic: it is stored without
		// touching updated_at.
		if observationOnly(before, r.V) && bookBefore == r.Book {
			body, err := r.encode()
			if err != nil {
				return nil, err
			}
			if err := tx.UpdateVolume(ctx, body); err != nil {
				return nil, err
			}
			continue
		}
		if err := s.save(ctx, tx, r); err != nil {
			return nil, err
		}
		if ws := before.BoundWorkspaceId; ws != "" {
			changed = append(changed, ws)
		}
	}
	return changed, nil
}

// observationOnly reports whether a and b differ at most in observation.
func observationOnly(a, b *ctrlv1.Volume) bool {
	a, b = proto.CloneOf(a), proto.CloneOf(b)
	a.Observation, b.Observation = nil, nil
	return proto.Equal(a, b)
}

// apply moves a Volume by what its host reports.
func (s *Service) apply(r *Record, rep *hostv1.VolumeReport) {
	now := s.Now.UTC()
	if rep.Condition != ctrlv1.VolumeCondition_VOLUME_CONDITION_UNSPECIFIED {
		// observed_at moves with the reports, so that it says how current
		// the observation is (it stays put once nothing holds the
		// Volume); an unchanged one is rewritten at most every
		// observationRefresh, not on every heartbeat.
		obs := &ctrlv1.VolumeObservation{Condition: rep.Condition, UsedBytes: rep.UsedBytes, Error: rep.Error,
			ObservedAt: timestamppb.New(now)}
		if old := r.V.Observation; old != nil && old.Condition == obs.Condition && old.UsedBytes == obs.UsedBytes &&
			old.Error == obs.Error && now.Sub(old.ObservedAt.AsTime()) < observationRefresh {
			obs = old
		}
		r.V.Observation = obs
	}
	failed := rep.FailureMessage != ""
	switch r.V.State {
	case ctrlv1.VolumeState_VOLUME_STATE_CREATING:
		switch {
		case rep.CapacityBytes > 0 && rep.Condition == ctrlv1.VolumeCondition_VOLUME_CONDITION_HEALTHY:
			r.Book.Created = true
			r.V.Spec.CapacityBytes = rep.CapacityBytes
			r.Book.Target = rep.CapacityBytes
			r.V.State = ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE
			r.V.State = r.settledState()
		case failed && rep.FailureStage == ctrlv1.FailureStage_FAILURE_STAGE_CREATING_VOLUME:
			r.V.State = ctrlv1.VolumeState_VOLUME_STATE_FAILED
			r.V.Failure = &ctrlv1.VolumeFailure{Reason: ctrlv1.FailureReason_FAILURE_REASON_INTERNAL, Stage: rep.FailureStage,
				Message: rep.FailureMessage, FailedAt: timestamppb.New(now)}
		}
	case ctrlv1.VolumeState_VOLUME_STATE_RESIZING, ctrlv1.VolumeState_VOLUME_STATE_ATTACHED, ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE:
		if rep.CapacityBytes > r.V.Spec.CapacityBytes {
			r.V.Spec.CapacityBytes = rep.CapacityBytes // only ever grows
		}
		if r.V.Spec.CapacityBytes < r.Book.Target && failed && rep.FailureStage == ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME {
			// The Volume keeps the capacity it has; the request ends here.
			r.V.Failure = &ctrlv1.VolumeFailure{Reason: ctrlv1.FailureReason_FAILURE_REASON_INTERNAL, Stage: rep.FailureStage,
				Message: rep.FailureMessage, FailedAt: timestamppb.New(now)}
			r.Book.Target = r.V.Spec.CapacityBytes
		}
		r.V.State = r.settledState()
	case ctrlv1.VolumeState_VOLUME_STATE_DELETING:
		if rep.Deleted {
			s.finishDelete(r)
		}
	}
}

// HostLost makes every live Volume a host holds UNKNOWN, keeping the state
// it had for HostBack; it returns the workspaces bound to those that
// changed.
func (s *Service) HostLost(ctx context.Context, tx store.Tx, hostID string) (changed []string, err error) {
	return s.eachHeld(ctx, tx, hostID, func(r *Record) bool {
		switch r.V.State {
		case ctrlv1.VolumeState_VOLUME_STATE_UNKNOWN, ctrlv1.VolumeState_VOLUME_STATE_LOST, ctrlv1.VolumeState_VOLUME_STATE_FAILED:
			return false
		}
		r.Book.Unknown, r.V.State = r.V.State, ctrlv1.VolumeState_VOLUME_STATE_UNKNOWN
		return true
	})
}

// HostBack gives every UNKNOWN Volume of a host that reports again the
// state it had when the host was lost (settled by what happened to its
// workspace meanwhile); the host's reports then move it as usual.
func (s *Service) HostBack(ctx context.Context, tx store.Tx, hostID string) (changed []string, err error) {
	return s.eachHeld(ctx, tx, hostID, func(r *Record) bool {
		if r.V.State != ctrlv1.VolumeState_VOLUME_STATE_UNKNOWN || r.Book.Unknown == ctrlv1.VolumeState_VOLUME_STATE_UNSPECIFIED {
			return false
		}
		r.V.State, r.Book.Unknown = r.Book.Unknown, ctrlv1.VolumeState_VOLUME_STATE_UNSPECIFIED
		r.V.State = r.settledState()
		return true
	})
}

// eachHeld saves every live Volume of a host that edit changes and
// returns the workspaces bound to them.
func (s *Service) eachHeld(ctx context.Context, tx store.Tx, hostID string, edit func(*Record) bool) ([]string, error) {
	rows, err := tx.HostVolumes(ctx, hostID)
	if err != nil {
		return nil, err
	}
	var changed []string
	for _, row := range rows {
		r, err := decode(row)
		if err != nil {
			return nil, err
		}
		if !edit(r) {
			continue
		}
		if err := s.save(ctx, tx, r); err != nil {
			return nil, err
		}
		if ws := r.V.BoundWorkspaceId; ws != "" {
			changed = append(changed, ws)
		}
	}
	return changed, nil
}
