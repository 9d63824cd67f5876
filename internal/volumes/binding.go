package volumes

import (
	"context"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// This file is what the workspaces package calls, inside its own
// transactions, to bind Volumes to Workspaces and release them.

// CreateForWorkspace creates the Volume a NEW binding asks for: in the
// default pool with the profile's capacity, held by the workspace's host
// and bound to the workspace, whose launch is about to use it.
func (s *Service) CreateForWorkspace(ctx context.Context, tx store.Tx, projectID, hostID, workspaceID string) (*Record, error) {
	pool, err := s.resolvePool(ctx, tx, "")
	if err != nil {
		return nil, err
	}
	r, err := s.create(ctx, tx, projectID, pool, hostID, 0, nil, nil)
	if err != nil {
		return nil, err
	}
	r.V.BoundWorkspaceId = workspaceID
	r.Book.Attached = true
	return r, s.save(ctx, tx, r)
}

// Bindable loads a Volume that a workspace of the project may bind: it
// exists, is not bound to another undeleted workspace, and is AVAILABLE.
func (s *Service) Bindable(ctx context.Context, tx store.Tx, projectID, volumeID, workspaceID string) (*Record, error) {
	r, err := Load(ctx, tx, projectID, volumeID)
	if err != nil {
		return nil, err
	}
	if err := writable(r); err != nil {
		return nil, err
	}
	if other := r.V.BoundWorkspaceId; other != "" && other != workspaceID {
		return nil, s.InUse(ctx, tx, projectID, other, "volume %s is bound to workspace %s; a volume is bound by one workspace at a time", volumeID, other)
	}
	if r.V.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE && r.V.BoundWorkspaceId != workspaceID {
		return nil, precondition("volume %s is %s; only an AVAILABLE volume can be bound", volumeID, StateName(r.V.State))
	}
	return r, nil
}

// Bind binds a Volume Bindable returned to a workspace placed on hostID,
// which must reach the Volume's pool; attached says whether the
// workspace holds an execution.
func (s *Service) Bind(ctx context.Context, tx store.Tx, r *Record, workspaceID, hostID string, attached bool) error {
	r.V.BoundWorkspaceId = workspaceID
	r.Row.HostID = hostID
	r.Book.Attached = attached
	r.V.State = attachedState(r.V.State, attached)
	return s.save(ctx, tx, r)
}

// Reaches reports whether a host reaches a storage pool.
func Reaches(ctx context.Context, tx store.Tx, hostID, pool string) (bool, error) {
	pools, err := Pools(ctx, tx)
	if err != nil {
		return false, err
	}
	return pools[pool].host(hostID) != nil, nil
}

// Release ends a workspace's binding of a Volume, when the Volume is still
// bound to it; deleteIt deletes the Volume too.
func (s *Service) Release(ctx context.Context, tx store.Tx, projectID, volumeID, workspaceID string, deleteIt bool) error {
	r, err := Load(ctx, tx, projectID, volumeID)
	if err != nil || r.V.BoundWorkspaceId != workspaceID {
		return err
	}
	r.V.BoundWorkspaceId = ""
	r.Book.Attached = false
	r.V.State = attachedState(r.V.State, false)
	if deleteIt {
		switch r.V.State {
		case ctrlv1.VolumeState_VOLUME_STATE_DELETING, ctrlv1.VolumeState_VOLUME_STATE_DELETED:
		default:
			s.beginDelete(r)
		}
	}
	return s.save(ctx, tx, r)
}

// SetAttached records whether the execution of the bound workspace holds
// the Volume, moving it between AVAILABLE and ATTACHED.
func (s *Service) SetAttached(ctx context.Context, tx store.Tx, projectID, volumeID string, attached bool) error {
	r, err := Load(ctx, tx, projectID, volumeID)
	if err != nil {
		return err
	}
	state := attachedState(r.V.State, attached)
	if r.Book.Attached == attached && state == r.V.State {
		return nil
	}
	r.Book.Attached = attached
	r.V.State = state
	return s.save(ctx, tx, r)
}

// attachedState is the state a Volume in state has once attached says
// whether an execution holds it; only AVAILABLE and ATTACHED move.
func attachedState(state ctrlv1.VolumeState, attached bool) ctrlv1.VolumeState {
	switch state {
	case ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE, ctrlv1.VolumeState_VOLUME_STATE_ATTACHED:
		if attached {
			return ctrlv1.VolumeState_VOLUME_STATE_ATTACHED
		}
		return ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE
	}
	return state
}
