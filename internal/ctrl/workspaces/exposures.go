package workspaces

// This file is what a workspace's execution means for the exposures of its
// guest ports: its host routes them while it runs, and they end with it.

import (
	"context"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Exposures is what the workspace service needs of the exposures of
// workspaces' guest ports (package exposures keeps them).
type Exposures interface {
	// HostAssignments returns the live exposures of the workspaces placed
	// on a host, by workspace ID, as the host routes them: one read for
	// the host's whole desired set, not one per workspace.
	HostAssignments(ctx context.Context, tx store.Tx, hostID string) (map[string][]*hostv1.ExposureAssignment, error)
	// EndWithExecution ends the exposures of a workspace whose execution
	// ends, inside tx: the persistent ones only when the workspace goes
	// away (deleted).
	EndWithExecution(ctx context.Context, tx store.Tx, projectID, workspaceID string, deleted bool) error
}

// exposureAssignments returns the live exposures of the workspaces placed
// on a host, by workspace ID.
func (s *Service) exposureAssignments(ctx context.Context, tx store.Tx, hostID string) (map[string][]*hostv1.ExposureAssignment, error) {
	if s.Exposures == nil {
		return nil, nil
	}
	return s.Exposures.HostAssignments(ctx, tx, hostID)
}

// endExposures ends the exposures of a record that no longer wants an
// execution (stopping, stopped, failed, deleting).
func (s *Service) endExposures(ctx context.Context, tx store.Tx, r *record) error {
	if s.Exposures == nil || r.book.Desired == DesiredRunning {
		return nil
	}
	return s.Exposures.EndWithExecution(ctx, tx, r.row.ProjectID, r.row.ID, r.book.Desired == DesiredDeleted)
}

// Placed returns, inside tx, a workspace of the project as callers read
// it and the host it is placed on (empty when none). An unknown workspace
// or another project's is not_found.
func (s *Service) Placed(ctx context.Context, tx store.Tx, projectID, id string) (*ctrlv1.Workspace, string, error) {
	r, err := s.load(ctx, tx, projectID, id)
	if err != nil {
		return nil, "", err
	}
	return observed(ctx, tx, r), r.row.HostID, nil
}
