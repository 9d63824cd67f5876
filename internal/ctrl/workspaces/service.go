package workspaces

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// Service implements the workspace methods over a store.
type Service struct {
	Store   store.Store
	Pages   *pagetoken.Codec
	Checker *netcheck.Checker
	// Volumes keeps the Volumes workspaces bind.
	Volumes *volumes.Service
	// Exposures keeps the exposures of workspaces' guest ports; nil when
	// the control plane serves none.
	Exposures Exposures
	// Changes is told about every committed change of a workspace, so that
	// watchers and host streams wake up.
	Changes *changes.Broker
	// Now is the clock; nil is time.Now.
	Now resource.Clock
	// Exporting, when set, returns the Transfer exporting a workspace
	// placed on hostID; empty when none is (see transfers).
	Exporting func(ctx context.Context, tx store.Tx, projectID, workspaceID, hostID string) (string, error)
	// HostLease is how long a host may stay silent before it is LOST
	// (ExpireLeases); zero is DefaultHostLease.
	HostLease time.Duration

	watches watches
	decoded decodedBodies // Assignments' records, by host, and reads
	// leasesSince is when this process first ran ExpireLeases, or first
	// after a run that failed.
	leasesSince atomic.Pointer[time.Time]
}

// Lease is the host lease in force.
func (s *Service) Lease() time.Duration { return cmp.Or(s.HostLease, DefaultHostLease) }

// Write describes a write request.
type Write[R proto.Message] = resource.Mutation[R]

func caller(ctx context.Context) auth.Caller {
	c, _ := auth.CallerFrom(ctx)
	return c
}

// mutate runs one command that changes one workspace: load it, let change
// edit the record, store it, and answer with the workspace.
func mutate[R proto.Message](ctx context.Context, s *Service, w Write[R], id string,
	change func(ctx context.Context, tx store.Tx, r *record) error, respond func(*ctrlv1.Workspace) R) (R, error) {
	resp, changed, err := resource.EditID(ctx, s.Store, w, "workspace_id", id, s.load, (*record).encode, change, s.save, present, respond)
	if changed {
		s.Changes.Publish(id)
	}
	return resp, err
}

// load reads a live workspace of the project; deleted and other projects'
// workspaces are not_found.
func (s *Service) load(ctx context.Context, tx store.Tx, projectID, id string) (*record, error) {
	return resource.Load(ctx, tx.Workspace, decode, "workspace", projectID, id)
}

// loadForRead is load for a read that presents the record and changes
// nothing: the record may be shared with other reads (decodedBodies).
func (s *Service) loadForRead(ctx context.Context, tx store.Tx, projectID, id string) (*record, error) {
	return resource.Load(ctx, tx.Workspace, s.decoded.forRead, "workspace", projectID, id)
}

// save stores a record, stamping updated_at.
func (s *Service) save(ctx context.Context, tx store.Tx, r *record) error {
	now := s.Now.UTC()
	r.ws.UpdatedAt = timestamppb.New(now)
	r.row.UpdatedAt = now
	if err := resource.Save(ctx, r.encode, tx.UpdateWorkspace, &r.row); err != nil {
		return err
	}
	if err := s.endExposures(ctx, tx, r); err != nil {
		return err
	}
	return s.syncVolume(ctx, tx, r)
}

// updateAnnouncing runs update in one write transaction, then tells Changes
// about every workspace or Volume whose ID update returned.
func (s *Service) updateAnnouncing(ctx context.Context, update func(tx store.Tx) ([]string, error)) error {
	var changed []string
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		var err error
		changed, err = update(tx)
		return err
	})
	for _, id := range changed {
		s.Changes.Publish(id)
	}
	return err
}

// precondition is failed_precondition with the workspace's durable state
// attached, as the reference asks.
func precondition(ws *ctrlv1.Workspace, format string, a ...any) error {
	if ws == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, a...))
	}
	return preconditionWith(&ctrlv1.ErrorDetail{ObservedWorkspace: ws}, format, a...)
}

// preconditionWith is failed_precondition carrying detail.
func preconditionWith(detail *ctrlv1.ErrorDetail, format string, a ...any) error {
	err := connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, a...))
	if d, derr := connect.NewErrorDetail(detail); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// InUse is the failed_precondition of a change that a workspace of the
// caller's project stands in the way of, with that workspace attached as
// ErrorDetail.observed_workspace (when it can be read).
func InUse(ctx context.Context, tx store.Tx, projectID, workspaceID, format string, a ...any) error {
	var ws *ctrlv1.Workspace
	if row, err := tx.Workspace(ctx, projectID, workspaceID); err == nil {
		if r, err := decode(row); err == nil {
			ws = observed(ctx, tx, r)
		}
	}
	return precondition(ws, format, a...)
}

// Get returns a workspace.
func (s *Service) Get(ctx context.Context, id string) (*ctrlv1.Workspace, error) {
	return resource.Read(ctx, s.Store, "workspace_id", id, s.loadForRead, present)
}

// List returns one page of live workspaces.
func (s *Service) List(ctx context.Context, pageSize uint32, token string, selector map[string]string) ([]*ctrlv1.Workspace, string, error) {
	return resource.ListPage(ctx, s.Store, s.Pages, "workspace", pageSize, token, selector,
		store.Tx.Workspaces,
		func(w store.Workspace) string { return w.ID },
		func(w store.Workspace) int { return len(w.Body) + meta.Bytes(w.Labels) },
		resource.Decoded(s.decoded.forRead, present))
}

// UpdateMap replaces the labels or the annotations (field) under CAS on
// their revision.
func UpdateMap[R proto.Message](ctx context.Context, s *Service, w Write[R], field resource.MapField, id string, expected uint64,
	m map[string]string, respond func(*ctrlv1.Workspace) R) (R, error) {
	if err := field.CheckMapWrite(m, expected); err != nil {
		var zero R
		return zero, err
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		if err := live(ctx, tx, r); err != nil {
			return err
		}
		current, revision := field.Select(&r.ws.Labels, &r.ws.LabelsRevision, &r.ws.Annotations, &r.ws.AnnotationsRevision)
		return field.Replace(current, revision, expected, m)
	}, respond)
}

// live refuses changes to a workspace that is going away.
func live(ctx context.Context, tx store.Tx, r *record) error {
	if r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING || r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return precondition(observed(ctx, tx, r), "workspace %s is %s", r.ws.WorkspaceId, StateName(r.ws.State))
	}
	return nil
}

// StateName is a state without its enum prefix, for messages.
func StateName(s ctrlv1.WorkspaceState) string {
	name := s.String()
	const prefix = "WORKSPACE_STATE_"
	if len(name) > len(prefix) {
		return name[len(prefix):]
	}
	return name
}
