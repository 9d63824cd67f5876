package volumes

import (
	"context"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// This file is what the workspaces package calls, inside its own
// transactions, to bind Volumes to Workspaces and release them.

// CreateForWorkspace creates the Volume a NEW binding asks for: in the
// default pool with the profile's capacity, held by the workspace's host
// and bound to the workspace, whose launch is about to use it. restore,
// when not zero, is the capacity of a Volume the launch restores from a
// Transfer: the host makes its image from the artifact, never empty.
func (s *Service) CreateForWorkspace(ctx context.Context, tx store.Tx, projectID, hostID, workspaceID string, restore uint64) (*Record, error) {
	pool, err := s.resolvePool(ctx, tx, "")
	if err != nil {
		return nil, err
	}
	r, err := s.create(ctx, tx, projectID, pool, hostID, restore, nil, nil)
	if err != nil {
		return nil, err
	}
	r.Book.Restoring = restore > 0
	r.V.BoundWorkspaceId = workspaceID
	r.Book.Attached = true
	r.Book.NewFor = workspaceID
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
	if workspaceID != "" && r.V.BoundWorkspaceId == workspaceID {
		return r, nil // already this workspace's
	}
	if r.V.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		return nil, precondition("volume %s is %s; only an AVAILABLE volume can be bound", volumeID, StateName(r.V.State))
	}
	return r, nil
}

// Bind binds a Volume Bindable returned to a workspace placed on the
// host that holds the Volume (Holder); attached says whether the
// workspace holds an execution.
func (s *Service) Bind(ctx context.Context, tx store.Tx, r *Record, workspaceID string, attached bool) error {
	r.V.BoundWorkspaceId = workspaceID
	r.Book.Attached = attached
	r.V.State = r.settledState()
	return s.save(ctx, tx, r)
}

// Holder is the host that holds the Volume's image: a storage pool is a
// directory on one host, so a workspace bound to the Volume runs there.
func (r *Record) Holder() string { return r.Row.HostID }

// Pool is the storage pool the Volume lives in.
func (r *Record) Pool() string { return r.V.Spec.GetStoragePool() }

// Uncreated reports whether the Volume is one that workspaceID's NEW
// binding asked for and no launch finished creating: it holds nothing to
// keep.
func (r *Record) Uncreated(workspaceID string) bool {
	return !r.Book.Created && r.Book.NewFor == workspaceID
}

// Release ends a workspace's binding of a Volume, when the Volume is still
// bound to it; deleteIt deletes the Volume too.
func (s *Service) Release(ctx context.Context, tx store.Tx, r *Record, workspaceID string, deleteIt bool) error {
	if r.V.BoundWorkspaceId != workspaceID {
		return nil
	}
	r.V.BoundWorkspaceId = ""
	r.Book.Attached = false
	r.V.State = r.settledState()
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
func (s *Service) SetAttached(ctx context.Context, tx store.Tx, r *Record, attached bool) error {
	before, wasAttached := r.V.State, r.Book.Attached
	r.Book.Attached = attached
	r.V.State = r.settledState()
	if wasAttached == attached && before == r.V.State {
		return nil
	}
	return s.save(ctx, tx, r)
}

// settledState is the state of a Volume that exists as created, given
// whether an execution holds it (Book.Attached) and whether a growth is
// still to be made (Book.Target): ATTACHED while held, else RESIZING
// until the host grew it, else AVAILABLE. A Volume in any other state
// keeps it.
func (r *Record) settledState() ctrlv1.VolumeState {
	switch r.V.State {
	case ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE, ctrlv1.VolumeState_VOLUME_STATE_ATTACHED, ctrlv1.VolumeState_VOLUME_STATE_RESIZING:
	default:
		return r.V.State
	}
	switch {
	case r.Book.Attached:
		return ctrlv1.VolumeState_VOLUME_STATE_ATTACHED
	case r.Book.Target > r.V.Spec.CapacityBytes:
		return ctrlv1.VolumeState_VOLUME_STATE_RESIZING
	}
	return ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE
}
