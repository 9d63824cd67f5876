package workspaces

// This file is the lifecycle callers and the clock drive: start, stop,
// delete, and expiration.

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Start starts a STOPPED (or FAILED) workspace.
func Start[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, respond func(*ctrlv1.Workspace) R) (R, error) {
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		switch r.ws.State {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
		default:
			return precondition(observed(ctx, tx, r), "workspace %s is %s; only a STOPPED or FAILED workspace can be started", id, StateName(r.ws.State))
		}
		if r.failedRestore() && r.ws.GetFailure().GetStage() == ctrlv1.FailureStage_FAILURE_STAGE_CREATING {
			// Its disk was never made, and its Transfer, FAILED with it,
			// holds no artifact to make it from.
			return precondition(observed(ctx, tx, r), "workspace %s failed before its restore from transfer %s made its disk, and that transfer holds its artifact no more: delete the workspace, and import and restore the artifact again",
				id, r.book.Restore.TransferID)
		}
		if err := s.volumeStartable(ctx, tx, r); err != nil {
			return err
		}
		if err := s.notExporting(ctx, tx, r); err != nil {
			return err
		}
		if err := s.placeStart(ctx, tx, r); err != nil {
			return err
		}
		if err := s.bindLaunch(ctx, tx, r); err != nil {
			return err
		}
		r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
		r.ws.LastStop, r.ws.Failure, r.ws.Delivery = nil, nil, nil
		r.book.Desired = DesiredRunning
		nextExecution(r)
		r.book.StopMode, r.book.StopCommand, r.book.StopCause = 0, "", 0
		return nil
	}, respond)
}

// Stop stops a workspace that runs or is starting; FORCE also cuts short a
// NORMAL stop in progress.
func Stop[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, mode ctrlv1.StopMode, respond func(*ctrlv1.Workspace) R) (R, error) {
	switch mode {
	case ctrlv1.StopMode_STOP_MODE_UNSPECIFIED:
		mode = ctrlv1.StopMode_STOP_MODE_NORMAL
	case ctrlv1.StopMode_STOP_MODE_NORMAL, ctrlv1.StopMode_STOP_MODE_FORCE:
	default:
		var zero R
		return zero, invalid("mode %d is not a known stop mode", mode)
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		switch r.ws.State {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING,
			ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN:
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING:
			if mode != ctrlv1.StopMode_STOP_MODE_FORCE || r.book.StopMode == ctrlv1.StopMode_STOP_MODE_FORCE {
				return precondition(observed(ctx, tx, r), "workspace %s is already STOPPING; only a FORCE stop can cut a NORMAL stop short", id)
			}
		default:
			return precondition(observed(ctx, tx, r), "workspace %s is %s; it is not running", id, StateName(r.ws.State))
		}
		unknown := r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
		s.beginStop(r, ctrlv1.StopCause_STOP_CAUSE_REQUESTED, mode, w.Command.GetCommandId())
		switch {
		case unknown && mode == ctrlv1.StopMode_STOP_MODE_FORCE:
			// Its host stopped reporting: a FORCE stop releases the
			// execution without it.
			s.releaseUnknown(r)
		case unknown:
			// A NORMAL stop waits for the host to stop it.
			r.book.Unknown, r.ws.State = r.ws.State, ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
		}
		return nil
	}, respond)
}

// Delete deletes a workspace: its host stops the execution and removes the
// writable layer, then it is DELETED.
func Delete[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, respond func(*ctrlv1.Workspace) R) (R, error) {
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		switch r.ws.State {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
			return nil // already going: returned unchanged
		}
		if err := s.notExporting(ctx, tx, r); err != nil {
			return err
		}
		return s.beginDelete(ctx, tx, r, ctrlv1.StopCause_STOP_CAUSE_REQUESTED)
	}, respond)
}

// UpdateExpiration sets or clears the expiration policy.
func UpdateExpiration[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, change *ctrlv1.WorkspaceExpirationChange, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	var policy *ctrlv1.WorkspaceExpirationPolicy
	switch c := change.GetChange().(type) {
	case *ctrlv1.WorkspaceExpirationChange_Set:
		if c.Set == nil {
			return zero, invalid("change.set is required")
		}
		policy = c.Set
	case *ctrlv1.WorkspaceExpirationChange_Clear:
	default:
		return zero, invalid("change must set or clear the expiration")
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		if err := live(ctx, tx, r); err != nil {
			return err
		}
		// Checked here, after the replay lookup: a retry replays even
		// once the deadline has passed.
		if err := checkExpiration(policy, s.Now.UTC()); err != nil {
			return err
		}
		rev := max(r.ws.GetExpiration().GetRevision(), r.book.ExpirationRevision)
		if proto.Equal(r.ws.GetExpiration().GetPolicy(), policy) {
			return nil
		}
		// A cleared expiration keeps its revision, without a policy.
		r.ws.Expiration = &ctrlv1.WorkspaceExpiration{Policy: policy, Revision: rev + 1}
		r.row.ExpiresAt = time.Time{}
		if policy != nil {
			r.row.ExpiresAt = policy.Deadline.AsTime()
		}
		return nil
	}, respond)
}

// Expire applies the expiration policies whose deadline has passed:
// STOP stops a running workspace normally, DELETE deletes it (once an
// export of it has ended); the cause is EXPIRED either way.
func (s *Service) Expire(ctx context.Context) error {
	return s.updateAnnouncing(ctx, func(tx store.Tx) ([]string, error) {
		var changed []string
		records, err := decodeAll(tx.ExpiredWorkspaces(ctx, s.Now.UTC(), 100))
		if err != nil {
			return changed, err
		}
		for _, r := range records {
			if r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
				continue // its host is LOST: it expires once the host is back or it is released
			}
			deletes := r.ws.GetExpiration().GetPolicy().GetAction() == ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE
			if deletes {
				// A workspace being exported is deleted once the export ends,
				// as DeleteWorkspace waits for it.
				if err := s.notExporting(ctx, tx, r); connect.CodeOf(err) == connect.CodeFailedPrecondition {
					continue
				} else if err != nil {
					return changed, err
				}
			}
			r.row.ExpiresAt = time.Time{} // fired: never again for this policy
			switch {
			case deletes:
				if err := s.beginDelete(ctx, tx, r, ctrlv1.StopCause_STOP_CAUSE_EXPIRED); err != nil {
					return changed, err
				}
			default:
				switch r.ws.State {
				case ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING,
					ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE:
					s.beginStop(r, ctrlv1.StopCause_STOP_CAUSE_EXPIRED, ctrlv1.StopMode_STOP_MODE_NORMAL, "")
				}
			}
			if err := s.save(ctx, tx, r); err != nil {
				return changed, err
			}
			changed = append(changed, r.row.ID)
		}
		return changed, nil
	})
}
