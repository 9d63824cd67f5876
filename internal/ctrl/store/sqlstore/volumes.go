package sqlstore

import (
	"context"
	"database/sql"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

const volumeColumns = `project_id, id, body, host_id, pool, workspace_id, created_at, updated_at, deleted_at`

func (t *tx) CreateVolume(ctx context.Context, v store.Volume) error {
	if _, err := t.exec(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		v.ProjectID, v.ID, blob(v.Body), v.HostID, v.Pool, v.WorkspaceID,
		toNanos(v.CreatedAt), toNanos(v.UpdatedAt), nullNanos(v.DeletedAt)); err != nil {
		return err
	}
	// deleted is false even for a deleted volume: it keeps its label rows,
	// so that Volume returns its labels; lists skip it by deleted_at.
	return t.indexLabels(ctx, v.ProjectID, v.ID, v.Labels, false)
}

func (t *tx) UpdateVolume(ctx context.Context, v store.Volume) error {
	err := mustAffect(t.exec(ctx, `UPDATE volumes SET body = ?, host_id = ?, pool = ?, workspace_id = ?,
		updated_at = ?, deleted_at = ? WHERE id = ? AND project_id = ?`,
		blob(v.Body), v.HostID, v.Pool, v.WorkspaceID, toNanos(v.UpdatedAt), nullNanos(v.DeletedAt), v.ID, v.ProjectID))
	if err != nil {
		return err
	}
	// Kept on deletion too, as in CreateVolume.
	return t.reindexLabels(ctx, v.ProjectID, v.ID, v.Labels, false)
}

func (t *tx) Volume(ctx context.Context, projectID, id string) (store.Volume, error) {
	return only(t.volumes(ctx, `SELECT `+volumeColumns+` FROM volumes
		WHERE id = ? AND project_id = ?`, id, projectID))
}

func (t *tx) Volumes(ctx context.Context, q store.ObjectQuery) ([]store.Volume, error) {
	query, args := livePage("volumes", volumeColumns, q)
	return t.volumes(ctx, query, args...)
}

func (t *tx) HostVolumes(ctx context.Context, hostID string) ([]store.Volume, error) {
	return t.volumes(ctx, `SELECT `+volumeColumns+` FROM volumes
		WHERE host_id = ? AND deleted_at IS NULL ORDER BY id`, hostID)
}

func (t *tx) PoolVolumes(ctx context.Context, pool string) ([]store.Volume, error) {
	return t.volumes(ctx, `SELECT `+volumeColumns+` FROM volumes
		WHERE pool = ? AND deleted_at IS NULL ORDER BY id`, pool)
}

// volumes runs a volume query and loads each row's labels.
func (t *tx) volumes(ctx context.Context, query string, args ...any) ([]store.Volume, error) {
	return labeledRows(ctx, t, scanVolume, func(v *store.Volume) (string, string, *map[string]string) {
		return v.ProjectID, v.ID, &v.Labels
	}, query, args...)
}

func scanVolume(row rowScanner) (store.Volume, error) {
	var (
		v                store.Volume
		created, updated int64
		deleted          sql.NullInt64
	)
	if err := row.Scan(&v.ProjectID, &v.ID, &v.Body, &v.HostID, &v.Pool, &v.WorkspaceID,
		&created, &updated, &deleted); err != nil {
		return store.Volume{}, notFound(err)
	}
	v.CreatedAt, v.UpdatedAt, v.DeletedAt = fromNanos(created), fromNanos(updated), fromNullNanos(deleted)
	return v, nil
}
