package sqlstore

import (
	"context"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

func (t *tx) CreateSession(ctx context.Context, s store.Session) error {
	_, err := t.exec(ctx, `INSERT INTO sessions (project_id, id, workspace_id, generation, expires_at, created_at, token_id)
		VALUES (?, ?, ?, ?, ?, ?, ?)`,
		s.ProjectID, s.ID, s.WorkspaceID, int64(s.Generation), toNanos(s.ExpiresAt), toNanos(s.CreatedAt), s.TokenID)
	return err
}

func (t *tx) Session(ctx context.Context, projectID, id string) (store.Session, error) {
	s := store.Session{ProjectID: projectID, ID: id}
	var generation, expires, created int64
	err := t.queryRow(ctx, `SELECT workspace_id, generation, expires_at, created_at, token_id FROM sessions
		WHERE project_id = ? AND id = ?`, projectID, id).Scan(&s.WorkspaceID, &generation, &expires, &created, &s.TokenID)
	if err != nil {
		return store.Session{}, notFound(err)
	}
	s.Generation, s.ExpiresAt, s.CreatedAt = uint64(generation), fromNanos(expires), fromNanos(created)
	return s, nil
}

func (t *tx) TokenSessions(ctx context.Context, tokenID string, expiringAfter time.Time) ([]store.Session, error) {
	rows, err := t.query(ctx, `SELECT project_id, id, workspace_id, generation, expires_at, created_at FROM sessions
		WHERE token_id = ? AND expires_at > ? ORDER BY project_id, id`, tokenID, toNanos(expiringAfter))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Session
	for rows.Next() {
		s := store.Session{TokenID: tokenID}
		var generation, expires, created int64
		if err := rows.Scan(&s.ProjectID, &s.ID, &s.WorkspaceID, &generation, &expires, &created); err != nil {
			return nil, err
		}
		s.Generation, s.ExpiresAt, s.CreatedAt = uint64(generation), fromNanos(expires), fromNanos(created)
		out = append(out, s)
	}
	return out, rows.Err()
}

func (t *tx) DeleteSessions(ctx context.Context, before time.Time, limit int) (int, error) {
	return t.execCount(ctx, `DELETE FROM sessions WHERE (project_id, id) IN (
		SELECT project_id, id FROM sessions WHERE expires_at < ? ORDER BY expires_at LIMIT ?)`,
		toNanos(before), limit)
}
