package sqlstore

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

func (t *tx) Setting(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := t.queryRow(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&v)
	return v, notFound(err)
}

func (t *tx) PutSetting(ctx context.Context, key string, value []byte) error {
	_, err := t.exec(ctx, `INSERT INTO settings (key, value) VALUES (?, ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`, key, blob(value))
	return err
}

func (t *tx) CreateProject(ctx context.Context, p store.Project) error {
	_, err := t.exec(ctx, `INSERT INTO projects (id, name, operator, created_at) VALUES (?, ?, ?, ?)`,
		p.ID, p.Name, p.Operator, toNanos(p.CreatedAt))
	return err
}

const projectColumns = `id, name, operator, created_at`

func scanProject(row rowScanner) (store.Project, error) {
	var p store.Project
	var created int64
	if err := row.Scan(&p.ID, &p.Name, &p.Operator, &created); err != nil {
		return store.Project{}, notFound(err)
	}
	p.CreatedAt = fromNanos(created)
	return p, nil
}

func (t *tx) Project(ctx context.Context, id string) (store.Project, error) {
	return scanProject(t.queryRow(ctx, `SELECT `+projectColumns+` FROM projects WHERE id = ?`, id))
}

func (t *tx) Projects(ctx context.Context) ([]store.Project, error) {
	rows, err := t.query(ctx, `SELECT `+projectColumns+` FROM projects ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return collect(rows, scanProject)
}

func (t *tx) CreateToken(ctx context.Context, tok store.Token) error {
	_, err := t.exec(ctx, `INSERT INTO tokens (id, project_id, role, name, secret_hash, created_at, revoked_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`,
		tok.ID, tok.ProjectID, tok.Role, tok.Name, blob(tok.SecretHash), toNanos(tok.CreatedAt), nullNanos(tok.RevokedAt))
	return err
}

const tokenColumns = `id, project_id, role, name, secret_hash, created_at, revoked_at`

func scanToken(row rowScanner) (store.Token, error) {
	var tok store.Token
	var created int64
	var revoked sql.NullInt64
	if err := row.Scan(&tok.ID, &tok.ProjectID, &tok.Role, &tok.Name, &tok.SecretHash, &created, &revoked); err != nil {
		return store.Token{}, notFound(err)
	}
	tok.CreatedAt = fromNanos(created)
	tok.RevokedAt = fromNullNanos(revoked)
	return tok, nil
}

func (t *tx) Token(ctx context.Context, id string) (store.Token, error) {
	return scanToken(t.queryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE id = ?`, id))
}

func (t *tx) Tokens(ctx context.Context, projectID string) ([]store.Token, error) {
	rows, err := t.query(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE project_id = ? ORDER BY id`, projectID)
	if err != nil {
		return nil, err
	}
	return collect(rows, scanToken)
}

func (t *tx) RevokeToken(ctx context.Context, id string, at time.Time) error {
	return mustAffect(t.exec(ctx, `UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`, toNanos(at), id))
}

func (t *tx) CreateHostToken(ctx context.Context, tok store.HostToken) error {
	// The host IDs are one column, separated by spaces, which no host ID
	// holds.
	_, err := t.exec(ctx, `INSERT INTO host_tokens (id, name, secret_hash, created_at, revoked_at, host_ids, any_host) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		tok.ID, tok.Name, blob(tok.SecretHash), toNanos(tok.CreatedAt), nullNanos(tok.RevokedAt), strings.Join(tok.HostIDs, " "), tok.AnyHost)
	return err
}

const hostTokenColumns = `id, name, secret_hash, created_at, revoked_at, host_ids, any_host`

func scanHostToken(row rowScanner) (store.HostToken, error) {
	var tok store.HostToken
	var created int64
	var revoked sql.NullInt64
	var hostIDs string
	if err := row.Scan(&tok.ID, &tok.Name, &tok.SecretHash, &created, &revoked, &hostIDs, &tok.AnyHost); err != nil {
		return store.HostToken{}, notFound(err)
	}
	tok.CreatedAt = fromNanos(created)
	tok.RevokedAt = fromNullNanos(revoked)
	tok.HostIDs = strings.Fields(hostIDs)
	return tok, nil
}

func (t *tx) HostToken(ctx context.Context, id string) (store.HostToken, error) {
	return scanHostToken(t.queryRow(ctx, `SELECT `+hostTokenColumns+` FROM host_tokens WHERE id = ?`, id))
}

func (t *tx) HostTokens(ctx context.Context) ([]store.HostToken, error) {
	rows, err := t.query(ctx, `SELECT `+hostTokenColumns+` FROM host_tokens ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return collect(rows, scanHostToken)
}

func (t *tx) RevokeHostToken(ctx context.Context, id string, at time.Time) error {
	return mustAffect(t.exec(ctx, `UPDATE host_tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`, toNanos(at), id))
}

func (t *tx) Command(ctx context.Context, projectID, commandID string) (store.Command, error) {
	c := store.Command{ProjectID: projectID, CommandID: commandID}
	var created int64
	err := t.queryRow(ctx, `SELECT method, request_hash, response, created_at FROM commands
		WHERE project_id = ? AND command_id = ?`, projectID, commandID).
		Scan(&c.Method, &c.RequestHash, &c.Response, &created)
	if err != nil {
		return store.Command{}, notFound(err)
	}
	c.CreatedAt = fromNanos(created)
	return c, nil
}

func (t *tx) PutCommand(ctx context.Context, c store.Command) error {
	_, err := t.exec(ctx, `INSERT INTO commands (project_id, command_id, method, request_hash, response, created_at)
		VALUES (?, ?, ?, ?, ?, ?)`, c.ProjectID, c.CommandID, c.Method, blob(c.RequestHash), blob(c.Response), toNanos(c.CreatedAt))
	return err
}

func (t *tx) PruneCommands(ctx context.Context, before time.Time, limit int) (int, error) {
	return t.execCount(ctx, `DELETE FROM commands WHERE (project_id, command_id) IN (
		SELECT project_id, command_id FROM commands WHERE created_at < ? ORDER BY created_at LIMIT ?)`,
		toNanos(before), limit)
}

// collect scans every row and closes rows.
func collect[T any](rows *sql.Rows, scan func(rowScanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
