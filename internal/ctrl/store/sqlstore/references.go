package sqlstore

import (
	"context"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

func (t *tx) SetPolicyReferences(ctx context.Context, projectID, workspaceID string, refs []store.PolicyReference) error {
	if _, err := t.exec(ctx, `DELETE FROM policy_references WHERE project_id = ? AND workspace_id = ?`,
		projectID, workspaceID); err != nil {
		return err
	}
	seen := map[store.PolicyReference]bool{}
	for _, r := range refs {
		if seen[r] {
			continue
		}
		seen[r] = true
		if _, err := t.exec(ctx, `INSERT INTO policy_references (project_id, workspace_id, kind, target_id)
			VALUES (?, ?, ?, ?)`, projectID, workspaceID, string(r.Kind), r.TargetID); err != nil {
			return err
		}
	}
	return nil
}

func (t *tx) ReferencingWorkspaces(ctx context.Context, projectID string, ref store.PolicyReference, limit int) ([]string, error) {
	rows, err := t.query(ctx, `SELECT workspace_id FROM policy_references
		WHERE target_id = ? AND kind = ? AND project_id = ? ORDER BY workspace_id LIMIT ?`,
		ref.TargetID, string(ref.Kind), projectID, limit)
	if err != nil {
		return nil, err
	}
	return collect(rows, func(row rowScanner) (string, error) {
		var id string
		return id, row.Scan(&id)
	})
}
