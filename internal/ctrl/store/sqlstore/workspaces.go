package sqlstore

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

const workspaceColumns = `project_id, id, template_id, body, host_id, cpu_millis, memory_bytes, layer_bytes,
	running, expires_at, created_at, updated_at, deleted_at`

func (t *tx) CreateWorkspace(ctx context.Context, w store.Workspace) error {
	if _, err := t.exec(ctx, `INSERT INTO workspaces (`+workspaceColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		w.ProjectID, w.ID, w.TemplateID, blob(w.Body), w.HostID, int64(w.CPUMillis), int64(w.MemoryBytes),
		int64(w.LayerBytes), w.Running, nullNanos(w.ExpiresAt), toNanos(w.CreatedAt), toNanos(w.UpdatedAt),
		nullNanos(w.DeletedAt)); err != nil {
		return err
	}
	t.touch(w.ProjectID, w.ID)
	return t.indexLabels(ctx, w.ProjectID, w.ID, w.Labels, !w.DeletedAt.IsZero())
}

func (t *tx) UpdateWorkspace(ctx context.Context, w store.Workspace) error {
	err := mustAffect(t.exec(ctx, `UPDATE workspaces SET body = ?, host_id = ?, cpu_millis = ?, memory_bytes = ?,
		layer_bytes = ?, running = ?, expires_at = ?, updated_at = ?, deleted_at = ?
		WHERE id = ? AND project_id = ?`,
		blob(w.Body), w.HostID, int64(w.CPUMillis), int64(w.MemoryBytes), int64(w.LayerBytes), w.Running,
		nullNanos(w.ExpiresAt), toNanos(w.UpdatedAt), nullNanos(w.DeletedAt), w.ID, w.ProjectID))
	if err != nil {
		return err
	}
	t.touch(w.ProjectID, w.ID)
	return t.reindexLabels(ctx, w.ProjectID, w.ID, w.Labels, !w.DeletedAt.IsZero())
}

func (t *tx) Workspace(ctx context.Context, projectID, id string) (store.Workspace, error) {
	if t.serveCached {
		if w, ok := t.cache.workspace(t.generation, projectID, id); ok {
			t.servedFromCache = true
			return w, nil
		}
	}
	w, err := only(t.workspaces(ctx, `SELECT `+workspaceColumns+` FROM workspaces
		WHERE id = ? AND project_id = ?`, id, projectID))
	if err == nil && t.cache != nil {
		kept := copyWorkspace(w)
		t.cache.put(t.generation, rowKey{projectID, id}, cachedRow{workspace: &kept})
	}
	return w, err
}

func (t *tx) Workspaces(ctx context.Context, q store.ObjectQuery) ([]store.Workspace, error) {
	query, args := livePage("workspaces", workspaceColumns, q)
	return t.workspaces(ctx, query, args...)
}

func (t *tx) HostWorkspaces(ctx context.Context, hostID string) ([]store.Workspace, error) {
	return t.workspaces(ctx, `SELECT `+workspaceColumns+` FROM workspaces
		WHERE host_id = ? AND deleted_at IS NULL ORDER BY id`, hostID)
}

func (t *tx) HostWorkspacesByID(ctx context.Context, hostID string, ids []string) ([]store.Workspace, error) {
	var list []store.Workspace
	err := inChunks(ids, func(in string, args []any) error {
		rows, err := t.workspaces(ctx, `SELECT `+workspaceColumns+` FROM workspaces
			WHERE id IN (`+in+`) AND host_id = ? AND deleted_at IS NULL ORDER BY id`, append(args, hostID)...)
		list = append(list, rows...)
		return err
	})
	return list, err
}

func (t *tx) WorkspacesByID(ctx context.Context, ids []string) ([]store.Workspace, error) {
	var list []store.Workspace
	err := inChunks(ids, func(in string, args []any) error {
		rows, err := t.workspaces(ctx, `SELECT `+workspaceColumns+` FROM workspaces WHERE id IN (`+in+`) ORDER BY id`, args...)
		list = append(list, rows...)
		return err
	})
	return list, err
}

func (t *tx) HostUsage(ctx context.Context, hostID string) (store.HostUsage, error) {
	var n, layer, cpu, memory int64
	err := t.queryRow(ctx, `SELECT COUNT(*), CAST(COALESCE(SUM(layer_bytes), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN running THEN cpu_millis ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN running THEN memory_bytes ELSE 0 END), 0) AS BIGINT)
		FROM workspaces WHERE host_id = ? AND deleted_at IS NULL`, hostID).Scan(&n, &layer, &cpu, &memory)
	return store.HostUsage{Workspaces: int(n), LayerBytes: uint64(layer), CPUMillis: uint64(cpu), MemoryBytes: uint64(memory)}, err
}

func (t *tx) ExpiredWorkspaces(ctx context.Context, now time.Time, limit int) ([]store.Workspace, error) {
	return t.workspaces(ctx, `SELECT `+workspaceColumns+` FROM workspaces
		WHERE deleted_at IS NULL AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at, id LIMIT ?`,
		toNanos(now), limit)
}

func (t *tx) TemplateUsers(ctx context.Context, projectID, templateID string, limit int) ([]string, error) {
	rows, err := t.query(ctx, `SELECT id FROM workspaces
		WHERE project_id = ? AND template_id = ? AND deleted_at IS NULL ORDER BY id LIMIT ?`, projectID, templateID, limit)
	if err != nil {
		return nil, err
	}
	return collect(rows, func(row rowScanner) (string, error) {
		var id string
		return id, row.Scan(&id)
	})
}

// workspaces runs a workspace query and loads each row's labels.
func (t *tx) workspaces(ctx context.Context, query string, args ...any) ([]store.Workspace, error) {
	return labeledRows(ctx, t, scanWorkspace, func(w *store.Workspace) (string, string, *map[string]string) {
		return w.ProjectID, w.ID, &w.Labels
	}, query, args...)
}

func scanWorkspace(row rowScanner) (store.Workspace, error) {
	var (
		w                  store.Workspace
		cpu, memory, layer int64
		created, updated   int64
		expires, deleted   sql.NullInt64
	)
	if err := row.Scan(&w.ProjectID, &w.ID, &w.TemplateID, &w.Body, &w.HostID, &cpu, &memory, &layer,
		&w.Running, &expires, &created, &updated, &deleted); err != nil {
		return store.Workspace{}, notFound(err)
	}
	w.CPUMillis, w.MemoryBytes, w.LayerBytes = uint32(cpu), uint64(memory), uint64(layer)
	w.ExpiresAt, w.DeletedAt = fromNullNanos(expires), fromNullNanos(deleted)
	w.CreatedAt, w.UpdatedAt = fromNanos(created), fromNanos(updated)
	return w, nil
}

func (t *tx) PutTemplateRevision(ctx context.Context, r store.TemplateRevision) error {
	_, err := t.exec(ctx, `INSERT INTO template_revisions (project_id, template_id, revision, body, created_at)
		VALUES (?, ?, ?, ?, ?)`, r.ProjectID, r.TemplateID, r.Revision, blob(r.Body), toNanos(r.CreatedAt))
	return err
}

func (t *tx) TemplateRevisions(ctx context.Context, projectID, templateID string) ([]store.TemplateRevision, error) {
	rows, err := t.query(ctx, `SELECT revision, body, created_at FROM template_revisions
		WHERE project_id = ? AND template_id = ? ORDER BY created_at, revision`, projectID, templateID)
	if err != nil {
		return nil, err
	}
	return collect(rows, func(row rowScanner) (store.TemplateRevision, error) {
		r := store.TemplateRevision{ProjectID: projectID, TemplateID: templateID}
		var created int64
		err := row.Scan(&r.Revision, &r.Body, &created)
		r.CreatedAt = fromNanos(created)
		return r, err
	})
}

func (t *tx) PutHost(ctx context.Context, h store.Host) error {
	_, err := t.exec(ctx, `INSERT INTO hosts (id, body, cpu_millis, memory_bytes, layer_bytes, seen_at, lost_at, drained, token_id)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET body = excluded.body, cpu_millis = excluded.cpu_millis,
			memory_bytes = excluded.memory_bytes, layer_bytes = excluded.layer_bytes, seen_at = excluded.seen_at,
			token_id = CASE WHEN excluded.token_id = '' THEN hosts.token_id ELSE excluded.token_id END`,
		h.ID, blob(h.Body), int64(h.CPUMillis), int64(h.MemoryBytes), int64(h.LayerBytes), toNanos(h.SeenAt),
		nullNanos(h.LostAt), h.Drained, h.TokenID)
	return err
}

func (t *tx) UpdateHost(ctx context.Context, h store.Host) error {
	return mustAffect(t.exec(ctx, `UPDATE hosts SET seen_at = ?, lost_at = ?, drained = ? WHERE id = ?`,
		toNanos(h.SeenAt), nullNanos(h.LostAt), h.Drained, h.ID))
}

func (t *tx) Hosts(ctx context.Context) ([]store.Host, error) {
	rows, err := t.query(ctx, `SELECT id, body, cpu_millis, memory_bytes, layer_bytes, seen_at, lost_at, drained, token_id FROM hosts ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return collect(rows, func(row rowScanner) (store.Host, error) {
		var h store.Host
		var cpu, memory, layer, seen int64
		var lost sql.NullInt64
		err := row.Scan(&h.ID, &h.Body, &cpu, &memory, &layer, &seen, &lost, &h.Drained, &h.TokenID)
		h.CPUMillis, h.MemoryBytes, h.LayerBytes, h.SeenAt = uint32(cpu), uint64(memory), uint64(layer), fromNanos(seen)
		h.LostAt = fromNullNanos(lost)
		return h, err
	})
}

func (t *tx) PutLaunchRevision(ctx context.Context, l store.LaunchRevision) (bool, error) {
	n, err := t.execCount(ctx, `INSERT INTO launch_revisions (id, platform, body, created_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING`, l.ID, l.Platform, blob(l.Body), toNanos(l.CreatedAt))
	return n > 0, err
}

func (t *tx) LaunchRevision(ctx context.Context, id string) (store.LaunchRevision, error) {
	return scanLaunch(t.queryRow(ctx, `SELECT id, platform, body, created_at FROM launch_revisions WHERE id = ?`, id))
}

func (t *tx) NewestLaunchRevision(ctx context.Context, platform string, among []string) (store.LaunchRevision, error) {
	args := []any{platform}
	filter := ""
	if len(among) > 0 {
		filter = " AND id IN (?" + strings.Repeat(", ?", len(among)-1) + ")"
		for _, id := range among {
			args = append(args, id)
		}
	}
	return scanLaunch(t.queryRow(ctx, `SELECT id, platform, body, created_at FROM launch_revisions
		WHERE platform = ?`+filter+` ORDER BY seq DESC LIMIT 1`, args...))
}

func scanLaunch(row rowScanner) (store.LaunchRevision, error) {
	var l store.LaunchRevision
	var created int64
	err := row.Scan(&l.ID, &l.Platform, &l.Body, &created)
	l.CreatedAt = fromNanos(created)
	return l, notFound(err)
}
