package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

const exposureColumns = `project_id, id, workspace_id, port, persistent, body, created_at, ended_at`

func (t *tx) CreateExposure(ctx context.Context, e store.Exposure) error {
	_, err := t.exec(ctx, `INSERT INTO exposures (`+exposureColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		e.ProjectID, e.ID, e.WorkspaceID, int64(e.Port), e.Persistent, blob(e.Body),
		toNanos(e.CreatedAt), nullNanos(e.EndedAt))
	return err
}

func (t *tx) Exposure(ctx context.Context, projectID, id string) (store.Exposure, error) {
	return scanExposure(t.queryRow(ctx, `SELECT `+exposureColumns+` FROM exposures
		WHERE id = ? AND project_id = ?`, id, projectID))
}

func (t *tx) EndExposure(ctx context.Context, projectID, id string, at time.Time) error {
	if _, err := t.Exposure(ctx, projectID, id); err != nil {
		return err
	}
	_, err := t.exec(ctx, `UPDATE exposures SET ended_at = ?
		WHERE id = ? AND project_id = ? AND ended_at IS NULL`, toNanos(at), id, projectID)
	return err
}

func (t *tx) WorkspaceExposures(ctx context.Context, projectID, workspaceID, after string, limit int) ([]store.Exposure, error) {
	query := `SELECT ` + exposureColumns + ` FROM exposures
		WHERE project_id = ? AND workspace_id = ? AND id > ? AND ended_at IS NULL ORDER BY id`
	args := []any{projectID, workspaceID, after}
	if limit > 0 {
		query += ` LIMIT ?`
		args = append(args, limit)
	}
	return t.exposures(ctx, query, args...)
}

func (t *tx) HostExposures(ctx context.Context, hostID string) ([]store.Exposure, error) {
	return t.exposures(ctx, `SELECT e.project_id, e.id, e.workspace_id, e.port, e.persistent, e.body, e.created_at, e.ended_at
		FROM exposures e JOIN workspaces w ON w.id = e.workspace_id AND w.project_id = e.project_id
		WHERE w.host_id = ? AND w.deleted_at IS NULL AND e.ended_at IS NULL ORDER BY e.workspace_id, e.id`, hostID)
}

// exposures runs a query of exposureColumns.
func (t *tx) exposures(ctx context.Context, query string, args ...any) ([]store.Exposure, error) {
	rows, err := t.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Exposure
	for rows.Next() {
		e, err := scanExposure(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

func (t *tx) EndWorkspaceExposures(ctx context.Context, projectID, workspaceID string, persistent bool, at time.Time) (int, error) {
	return t.execCount(ctx, `UPDATE exposures SET ended_at = ?
		WHERE project_id = ? AND workspace_id = ? AND ended_at IS NULL AND (persistent = ? OR ?)`,
		toNanos(at), projectID, workspaceID, false, persistent)
}

func scanExposure(row rowScanner) (store.Exposure, error) {
	var (
		e       store.Exposure
		port    int64
		created int64
		ended   sql.NullInt64
	)
	if err := row.Scan(&e.ProjectID, &e.ID, &e.WorkspaceID, &port, &e.Persistent, &e.Body, &created, &ended); err != nil {
		return store.Exposure{}, notFound(err)
	}
	e.Port, e.CreatedAt, e.EndedAt = uint32(port), fromNanos(created), fromNullNanos(ended)
	return e, nil
}
