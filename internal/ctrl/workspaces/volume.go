package workspaces

import (
	"context"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/guestabi"
)

// This file is the workspace's side of its Volume: the binding, what a
// Volume means for starting and deleting, and the PROMISED tier.

// boundVolume returns the ID of the Volume the workspace's binding names;
// empty without one.
func boundVolume(r *record) string {
	b := r.ws.GetSpec().GetVolume()
	if b.GetMode() != ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND {
		return ""
	}
	return b.VolumeId
}

// boundRecord loads the Volume the workspace's binding names; nil
// without one.
func boundRecord(ctx context.Context, tx store.Tx, r *record) (*volumes.Record, error) {
	id := boundVolume(r)
	if id == "" {
		return nil, nil
	}
	return volumes.Load(ctx, tx, r.row.ProjectID, id)
}

// holdsExecution reports whether the workspace has, or is about to have,
// an execution: the state in which its Volume is ATTACHED and its binding
// cannot change.
func holdsExecution(r *record) bool {
	switch r.ws.State {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED,
		ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
		return false
	}
	return true
}

// syncVolume keeps the bound Volume ATTACHED exactly while the workspace
// holds an execution. A deletion leaves it as it was (ATTACHED only if an
// execution still runs) until the deletion completes and releases it.
func (s *Service) syncVolume(ctx context.Context, tx store.Tx, r *record) error {
	switch r.ws.State {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
		return nil
	}
	v, err := boundRecord(ctx, tx, r)
	if err != nil || v == nil || v.V.BoundWorkspaceId != r.row.ID {
		return err
	}
	return s.Volumes.SetAttached(ctx, tx, v, holdsExecution(r))
}

// releaseVolume ends the binding of a workspace that is deleted: the
// Volume is deleted with it when deleteIt says so, or when no launch had
// finished creating it when the deletion began (it holds nothing to
// keep); else it is kept.
func (s *Service) releaseVolume(ctx context.Context, tx store.Tx, r *record, deleteIt bool) error {
	v, err := boundRecord(ctx, tx, r)
	if err != nil || v == nil {
		return err
	}
	return s.Volumes.Release(ctx, tx, v, r.row.ID, deleteIt || r.book.VolumeUncreated || v.Uncreated(r.row.ID))
}

// volumeLost reports whether the workspace's Volume is LOST.
func volumeLost(ctx context.Context, tx store.Tx, r *record) (bool, error) {
	v, err := boundRecord(ctx, tx, r)
	if err != nil || v == nil {
		return false, err
	}
	return v.V.State == ctrlv1.VolumeState_VOLUME_STATE_LOST, nil
}

// volumeStartable refuses to start a workspace whose Volume cannot be
// mounted: LOST is FAILURE_REASON_VOLUME_LOST; a resize or a failed
// creation stands in the way until it ends or the workspace is rebound.
func (s *Service) volumeStartable(ctx context.Context, tx store.Tx, r *record) error {
	v, err := boundRecord(ctx, tx, r)
	if err != nil || v == nil {
		return err
	}
	id := v.V.VolumeId
	if mountPath := r.ws.GetSpec().GetVolume().GetMountPath(); mountPath != "" {
		// A path an earlier release took that the guest reserves now.
		if err := guestabi.CheckVolumePath(mountPath); err != nil {
			return precondition(observed(ctx, tx, r), "volume %s of workspace %s is mounted at %s, which no workspace can start with: %v; move it (kibotos ws volume %s %s:/data) and start again",
				id, r.row.ID, mountPath, err, r.row.ID, id)
		}
	}
	switch v.V.State {
	case ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE, ctrlv1.VolumeState_VOLUME_STATE_CREATING:
		return nil
	case ctrlv1.VolumeState_VOLUME_STATE_LOST:
		return preconditionWith(&ctrlv1.ErrorDetail{ObservedWorkspace: observed(ctx, tx, r),
			Reason: ctrlv1.FailureReason_FAILURE_REASON_VOLUME_LOST, Stage: ctrlv1.FailureStage_FAILURE_STAGE_STARTING},
			"volume %s of workspace %s is LOST: its data is gone; bind another volume or delete the workspace", id, r.row.ID)
	}
	why := ""
	if v.V.State == ctrlv1.VolumeState_VOLUME_STATE_UNKNOWN {
		why = " (its host is not reporting)"
	}
	return precondition(observed(ctx, tx, r), "volume %s of workspace %s is %s%s; start the workspace again once the volume is AVAILABLE",
		id, r.row.ID, volumes.StateName(v.V.State), why)
}

// observed is the workspace as a refusal carries it
// (ErrorDetail.observed_workspace): as callers read it, or as stored when
// its Volume cannot be read.
func observed(ctx context.Context, tx store.Tx, r *record) *ctrlv1.Workspace {
	if ws, err := present(ctx, tx, r); err == nil {
		return ws
	}
	return r.view()
}

// present returns the workspace as callers read it: its persistent_paths
// and PROMISED tier show its Volume as it is now.
func present(ctx context.Context, tx store.Tx, r *record) (*ctrlv1.Workspace, error) {
	ws := r.view()
	v, err := boundRecord(ctx, tx, r)
	if err != nil {
		return nil, err
	}
	if v == nil {
		ws.PersistentPaths = nil
		return ws, nil
	}
	path := ws.Spec.Volume.MountPath
	ws.PersistentPaths = []string{path}
	tier := &ctrlv1.RetentionTier{
		Kind:         ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED,
		Paths:        []string{path},
		Availability: ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_UNAVAILABLE,
		Continuity:   ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_UNKNOWN,
	}
	switch v.V.State {
	case ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE, ctrlv1.VolumeState_VOLUME_STATE_ATTACHED, ctrlv1.VolumeState_VOLUME_STATE_RESIZING:
		tier.Availability = ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_AVAILABLE
		tier.Continuity = ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_CONTINUED
		capacity := v.V.Spec.CapacityBytes
		tier.CapacityBytes = &capacity
	}
	for i, t := range ws.RetentionTiers {
		if t.Kind == ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED {
			ws.RetentionTiers[i] = tier
		}
	}
	return ws, nil
}

// executionVolume is what an execution of the workspace mounts; nil
// without a Volume.
func executionVolume(ctx context.Context, tx store.Tx, r *record) (*hostv1.ExecutionVolume, error) {
	v, err := boundRecord(ctx, tx, r)
	if err != nil || v == nil {
		return nil, err
	}
	return &hostv1.ExecutionVolume{VolumeId: v.V.VolumeId, StoragePool: v.V.Spec.StoragePool, MountPath: r.ws.Spec.Volume.MountPath}, nil
}

// UpdateVolumeBinding replaces the workspace's Volume binding under CAS
// on binding_revision while it holds no execution.
func UpdateVolumeBinding[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, expected uint64,
	binding *ctrlv1.WorkspaceVolumeBinding, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	b, err := checkVolume(binding, false)
	if err != nil {
		return zero, err
	}
	if expected == 0 {
		return zero, invalid("expected_binding_revision is required: send the revision you observed")
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		if err := live(ctx, tx, r); err != nil {
			return err
		}
		if rev := r.ws.Spec.BindingRevision; rev != expected {
			return command.Aborted("binding_revision", expected, rev)
		}
		current := r.ws.Spec.GetVolume()
		if proto.Equal(current, b) {
			return nil
		}
		if holdsExecution(r) {
			return precondition(observed(ctx, tx, r), "workspace %s is %s; its volume binding changes only while it holds no execution (STOPPED or FAILED)", id, StateName(r.ws.State))
		}
		old := boundVolume(r)
		if b.VolumeId != old {
			if b.Mode == ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND {
				v, err := s.Volumes.Bindable(ctx, tx, r.row.ProjectID, b.VolumeId, id)
				if err != nil {
					return err
				}
				if v.Holder() != r.row.HostID {
					return precondition(observed(ctx, tx, r), "volume %s lives in storage pool %s of another host than workspace %s's; bind it to a new workspace instead", b.VolumeId, v.Pool(), id)
				}
				if err := s.Volumes.Bind(ctx, tx, v, id, false); err != nil {
					return err
				}
			}
			if old != "" {
				// A released Volume is always kept.
				v, err := boundRecord(ctx, tx, r)
				if err != nil {
					return err
				}
				if err := s.Volumes.Release(ctx, tx, v, id, false); err != nil {
					return err
				}
			}
		}
		r.ws.Spec.Volume = b
		r.ws.Spec.BindingRevision++
		return nil
	}, respond)
}
