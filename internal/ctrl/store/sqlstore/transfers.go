package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

const transferColumns = `project_id, id, body, host_id, pending, expires_at, created_at, updated_at, deleted_at`

func (t *tx) CreateTransfer(ctx context.Context, tr store.Transfer) error {
	if _, err := t.exec(ctx, `INSERT INTO transfers (`+transferColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		tr.ProjectID, tr.ID, blob(tr.Body), tr.HostID, tr.Pending, nullNanos(tr.ExpiresAt),
		toNanos(tr.CreatedAt), toNanos(tr.UpdatedAt), nullNanos(tr.DeletedAt)); err != nil {
		return err
	}
	// Like volumes, a deleted transfer keeps its label rows; lists skip it
	// by deleted_at.
	return t.indexLabels(ctx, tr.ProjectID, tr.ID, tr.Labels, false)
}

func (t *tx) UpdateTransfer(ctx context.Context, tr store.Transfer) error {
	err := mustAffect(t.exec(ctx, `UPDATE transfers SET body = ?, host_id = ?, pending = ?, expires_at = ?,
		updated_at = ?, deleted_at = ? WHERE id = ? AND project_id = ?`,
		blob(tr.Body), tr.HostID, tr.Pending, nullNanos(tr.ExpiresAt), toNanos(tr.UpdatedAt), nullNanos(tr.DeletedAt),
		tr.ID, tr.ProjectID))
	if err != nil {
		return err
	}
	return t.reindexLabels(ctx, tr.ProjectID, tr.ID, tr.Labels, false)
}

func (t *tx) Transfer(ctx context.Context, projectID, id string) (store.Transfer, error) {
	return only(t.transfers(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE id = ? AND project_id = ?`, id, projectID))
}

func (t *tx) TransferByID(ctx context.Context, id string) (store.Transfer, error) {
	return only(t.transfers(ctx, `SELECT `+transferColumns+` FROM transfers WHERE id = ?`, id))
}

func (t *tx) Transfers(ctx context.Context, q store.ObjectQuery) ([]store.Transfer, error) {
	query, args := livePage("transfers", transferColumns, q)
	return t.transfers(ctx, query, args...)
}

func (t *tx) HostTransfers(ctx context.Context, hostID string) ([]store.Transfer, error) {
	return t.transfers(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE host_id = ? AND deleted_at IS NULL ORDER BY id`, hostID)
}

func (t *tx) PendingTransfers(ctx context.Context, limit int) ([]store.Transfer, error) {
	return t.transfers(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE pending AND deleted_at IS NULL ORDER BY id LIMIT ?`, limit)
}

func (t *tx) ExpiredTransfers(ctx context.Context, now time.Time, limit int) ([]store.Transfer, error) {
	return t.transfers(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE deleted_at IS NULL AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at, id LIMIT ?`,
		toNanos(now), limit)
}

// transfers runs a transfer query and loads each row's labels.
func (t *tx) transfers(ctx context.Context, query string, args ...any) ([]store.Transfer, error) {
	return labeledRows(ctx, t, scanTransfer, func(tr *store.Transfer) (string, string, *map[string]string) {
		return tr.ProjectID, tr.ID, &tr.Labels
	}, query, args...)
}

func scanTransfer(row rowScanner) (store.Transfer, error) {
	var (
		tr               store.Transfer
		created, updated int64
		expires, deleted sql.NullInt64
	)
	if err := row.Scan(&tr.ProjectID, &tr.ID, &tr.Body, &tr.HostID, &tr.Pending, &expires,
		&created, &updated, &deleted); err != nil {
		return store.Transfer{}, notFound(err)
	}
	tr.CreatedAt, tr.UpdatedAt = fromNanos(created), fromNanos(updated)
	tr.ExpiresAt, tr.DeletedAt = fromNullNanos(expires), fromNullNanos(deleted)
	return tr, nil
}
