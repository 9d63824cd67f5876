// Package sessions is ctrl's SessionService: it issues data-plane sessions
// for AVAILABLE workspaces, revokes them, and rotates a workspace's
// data-plane key.
//
// A session is a bearer token (package token) that the host running the
// workspace checks by itself: ctrl keeps each workspace's key and revoked
// sessions in the workspace's record (workspaces.DataPlane) and every
// change reaches the host in its assignments at once. The store indexes
// issued sessions by ID only so that RevokeSession, which names a session
// alone, finds its workspace.
package sessions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/sdk/sessiontoken"
)

// Limits of a session's lifetime.
const (
	// DefaultTTL is the lifetime of a session issued with ttl_seconds 0.
	DefaultTTL = time.Hour
	// MaxTTL is the longest lifetime a session may have.
	MaxTTL = 24 * time.Hour
	// MaxRevoked bounds the revoked, unexpired sessions one workspace keeps
	// (each is sent to its host in every assignment); RotateDataPlane
	// clears them.
	MaxRevoked = 1000
	// Retention is how long the index keeps a session after it expires:
	// RevokeSession of it succeeds until then and is not_found after.
	Retention = 7 * 24 * time.Hour
)

// Service implements the session methods.
type Service struct {
	Store      store.Store
	Workspaces *workspaces.Service
	// Now is the clock; nil is time.Now.
	Now resource.Clock
}

func caller(ctx context.Context) auth.Caller {
	c, _ := auth.CallerFrom(ctx)
	return c
}

// Issue issues a session for an AVAILABLE workspace of the caller's
// project, valid for ttlSeconds (0 selects DefaultTTL, above MaxTTL is
// invalid_argument). The session is stored before its token is returned,
// so it can be revoked at once.
func (s *Service) Issue(ctx context.Context, workspaceID string, ttlSeconds uint32) (*ctrlv1.IssueSessionResponse, error) {
	if workspaceID == "" {
		return nil, invalid("workspace_id is required")
	}
	ttl := time.Duration(ttlSeconds) * time.Second
	switch {
	case ttl == 0:
		ttl = DefaultTTL
	case ttl > MaxTTL:
		return nil, invalid("ttl_seconds %d is above the maximum of %d", ttlSeconds, int(MaxTTL.Seconds()))
	}
	c := caller(ctx)
	var (
		resp      *ctrlv1.IssueSessionResponse
		published bool
	)
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		published = false
		now := s.Now.UTC()
		if err := checkIssuer(ctx, tx, c.TokenID); err != nil {
			return err
		}
		return s.Workspaces.EditDataPlane(ctx, tx, c.ProjectID, workspaceID, func(ws *ctrlv1.Workspace, hostID string, dp *workspaces.DataPlane) (bool, error) {
			if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
				return false, precondition(ws, ctrlv1.FailureStage_FAILURE_STAGE_ISSUING_SESSION,
					"workspace %s is %s; sessions are issued only for an AVAILABLE workspace", workspaceID, workspaces.StateName(ws.State))
			}
			endpoint, err := workspaces.DataPlaneEndpoint(ctx, tx, hostID)
			if err != nil {
				return false, err
			}
			if endpoint == "" {
				return false, withDetail(connect.NewError(connect.CodeUnavailable, fmt.Errorf(
					"the host running workspace %s serves no data plane", workspaceID)),
					&ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE, Stage: ctrlv1.FailureStage_FAILURE_STAGE_ISSUING_SESSION})
			}
			changed := false
			if len(dp.Key) == 0 {
				// A workspace that became AVAILABLE before keys existed.
				dp.Key, changed = workspaces.NewDataPlaneKey(), true
			}
			ses := store.Session{ProjectID: c.ProjectID, ID: ids.New("ses"), WorkspaceID: workspaceID,
				Generation: ws.Generation, ExpiresAt: time.Unix(now.Add(ttl).Unix(), 0).UTC(), CreatedAt: now, TokenID: c.TokenID}
			if err := tx.CreateSession(ctx, ses); err != nil {
				return false, err
			}
			resp = &ctrlv1.IssueSessionResponse{
				SessionId: ses.ID,
				Token: sessiontoken.Sign(dp.Key, sessiontoken.Claims{SessionID: ses.ID, WorkspaceID: workspaceID,
					Generation: ses.Generation, ExpiresAt: ses.ExpiresAt}),
				Endpoint:  endpoint,
				ExpiresAt: timestamppb.New(ses.ExpiresAt),
			}
			published = changed
			return changed, nil
		})
	})
	if err != nil {
		return nil, err
	}
	if published {
		s.Workspaces.Changes.Publish(workspaceID)
	}
	return resp, nil
}

// checkIssuer refuses a session to a token revoked since its caller was
// authenticated: a revocation reaches another replica's cache of callers
// only after its --auth-cache-ttl, and a session issued there meanwhile
// would outlive the revocation's sweep of the token's sessions. In the
// transaction that stores the session, this read orders the two (SQLite
// has one writer; PostgreSQL's serializable transactions abort one of
// them).
func checkIssuer(ctx context.Context, tx store.Tx, tokenID string) error {
	if tokenID == "" {
		return nil // not a token's call (the deployment's own)
	}
	tok, err := tx.Token(ctx, tokenID)
	if errors.Is(err, store.ErrNotFound) || err == nil && !tok.RevokedAt.IsZero() {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("the API token of this call was revoked"))
	}
	return err
}

// Revoke revokes a session of the caller's project: its workspace's host
// refuses its token as soon as the change reaches it. Revoking a revoked
// or expired session succeeds; an unknown one is not_found.
func (s *Service) Revoke(ctx context.Context, w workspaces.Write[*ctrlv1.RevokeSessionResponse], sessionID string) (*ctrlv1.RevokeSessionResponse, error) {
	if sessionID == "" {
		return nil, invalid("session_id is required")
	}
	var changed string
	resp, err := resource.Run(ctx, s.Store, w, func(ctx context.Context, tx store.Tx, projectID string) (*ctrlv1.RevokeSessionResponse, error) {
		changed = ""
		ses, err := resource.Get(ctx, tx.Session, "session", projectID, sessionID)
		if err != nil {
			return nil, err
		}
		now := s.Now.UTC()
		revoked := workspaces.RevokedSession{ID: ses.ID, ExpiresAt: ses.ExpiresAt}
		if !revoked.Listed(now) {
			return &ctrlv1.RevokeSessionResponse{}, nil // expired: it works nowhere
		}
		err = s.Workspaces.EditDataPlane(ctx, tx, projectID, ses.WorkspaceID, func(ws *ctrlv1.Workspace, _ string, dp *workspaces.DataPlane) (bool, error) {
			added, err := revoke(ws, dp, []store.Session{ses}, now, false)
			if added {
				changed = ws.WorkspaceId
			}
			return added, err
		})
		if connect.CodeOf(err) == connect.CodeNotFound {
			err = nil // the workspace is gone, and the session with it
		}
		if err != nil {
			return nil, err
		}
		return &ctrlv1.RevokeSessionResponse{}, nil
	})
	if err == nil && changed != "" {
		s.Workspaces.Changes.Publish(changed)
	}
	return resp, err
}

// revoke adds the sessions of one workspace to its revoked ones, and
// reports whether dp changed. A session of another generation (its
// execution is gone) or already listed is left out. Beyond MaxRevoked
// unexpired revocations it is resource_exhausted, unless rotate: then the
// workspace gets a new key instead, which ends every session of it.
func revoke(ws *ctrlv1.Workspace, dp *workspaces.DataPlane, sessions []store.Session, now time.Time, rotate bool) (bool, error) {
	if ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return false, nil // its execution is gone: the tokens work nowhere
	}
	kept := dp.Revoked[:0]
	listed := map[string]bool{}
	for _, r := range dp.Revoked {
		if r.Listed(now) {
			kept = append(kept, r)
			listed[r.ID] = true
		}
	}
	changed := len(kept) != len(dp.Revoked)
	for _, ses := range sessions {
		r := workspaces.RevokedSession{ID: ses.ID, ExpiresAt: ses.ExpiresAt}
		if ses.Generation != ws.Generation || listed[ses.ID] || !r.Listed(now) {
			continue
		}
		if len(kept) >= MaxRevoked {
			if rotate {
				dp.Key, dp.Revoked = workspaces.NewDataPlaneKey(), nil
				return true, nil
			}
			return false, withDetail(connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
				"workspace %s already has %d revoked sessions that have not expired; rotate its data plane to end every session",
				ws.WorkspaceId, len(kept))), &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED})
		}
		kept = append(kept, r)
		listed[ses.ID] = true
		changed = true
	}
	dp.Revoked = kept
	return changed, nil
}

// RevokeIssuedBy revokes every unexpired session the API token of the
// project issued, in every workspace, as RevokeSession would each: the
// token's revocation ends the data-plane access it handed out. Sessions of
// the project that no token is recorded for (issued before tokens were)
// go too, as any of them may be the token's. A workspace with too many
// revoked sessions already gets a new data-plane key instead, which ends
// all of its sessions. It is for the token's revocation, which the caller
// has checked and made.
func (s *Service) RevokeIssuedBy(ctx context.Context, projectID, tokenID string) error {
	if tokenID == "" {
		return nil
	}
	var changed []string
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		changed = changed[:0]
		now := s.Now.UTC()
		issued, err := tx.TokenSessions(ctx, tokenID, now)
		if err != nil {
			return err
		}
		unattributed, err := tx.TokenSessions(ctx, "", now)
		if err != nil {
			return err
		}
		for _, ses := range unattributed {
			if ses.ProjectID == projectID {
				issued = append(issued, ses)
			}
		}
		byWorkspace := map[[2]string][]store.Session{}
		for _, ses := range issued {
			k := [2]string{ses.ProjectID, ses.WorkspaceID}
			byWorkspace[k] = append(byWorkspace[k], ses)
		}
		for k, sessions := range byWorkspace {
			var edited bool
			err := s.Workspaces.EditDataPlane(ctx, tx, k[0], k[1], func(ws *ctrlv1.Workspace, _ string, dp *workspaces.DataPlane) (bool, error) {
				var rerr error
				edited, rerr = revoke(ws, dp, sessions, now, true)
				return edited, rerr
			})
			switch {
			case connect.CodeOf(err) == connect.CodeNotFound:
				continue // the workspace is gone, and its sessions with it
			case err != nil:
				return err
			}
			if edited {
				changed = append(changed, k[1])
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, id := range changed {
		s.Workspaces.Changes.Publish(id)
	}
	return nil
}

// Rotate gives a workspace of the caller's project a new data-plane key:
// every session issued before stops working as soon as the change reaches
// its host. A DELETING or DELETED workspace is failed_precondition (stage
// ROTATING_DATA_PLANE).
func (s *Service) Rotate(ctx context.Context, w workspaces.Write[*ctrlv1.RotateDataPlaneResponse], workspaceID string) (*ctrlv1.RotateDataPlaneResponse, error) {
	if workspaceID == "" {
		return nil, invalid("workspace_id is required")
	}
	resp, err := resource.Run(ctx, s.Store, w, func(ctx context.Context, tx store.Tx, projectID string) (*ctrlv1.RotateDataPlaneResponse, error) {
		var resp *ctrlv1.RotateDataPlaneResponse
		err := s.Workspaces.EditDataPlane(ctx, tx, projectID, workspaceID, func(ws *ctrlv1.Workspace, _ string, dp *workspaces.DataPlane) (bool, error) {
			switch ws.State {
			case ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
				return false, precondition(ws, ctrlv1.FailureStage_FAILURE_STAGE_ROTATING_DATA_PLANE,
					"workspace %s is %s", workspaceID, workspaces.StateName(ws.State))
			}
			resp = &ctrlv1.RotateDataPlaneResponse{Workspace: ws}
			dp.Key, dp.Revoked = workspaces.NewDataPlaneKey(), nil
			return true, nil
		})
		return resp, err
	})
	if err == nil {
		s.Workspaces.Changes.Publish(workspaceID)
	}
	return resp, err
}

// Prune deletes from the index the sessions that expired more than
// Retention ago, a batch at a time, and returns how many it deleted. Run
// it periodically.
func (s *Service) Prune(ctx context.Context) (int, error) {
	const batch = 1000
	total := 0
	for {
		var n int
		err := s.Store.Update(ctx, func(tx store.Tx) (err error) {
			n, err = tx.DeleteSessions(ctx, s.Now.UTC().Add(-Retention), batch)
			return err
		})
		total += n
		if err != nil || n < batch {
			return total, err
		}
	}
}

func invalid(format string, a ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, a...))
}

func withDetail(err *connect.Error, d *ctrlv1.ErrorDetail) error {
	if detail, derr := connect.NewErrorDetail(d); derr == nil {
		err.AddDetail(detail)
	}
	return err
}

// precondition is failed_precondition with the workspace's durable state
// and the failing stage attached.
func precondition(ws *ctrlv1.Workspace, stage ctrlv1.FailureStage, format string, a ...any) error {
	return withDetail(connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, a...)),
		&ctrlv1.ErrorDetail{ObservedWorkspace: ws, Stage: stage})
}
