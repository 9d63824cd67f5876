package sqlstore

import (
	"context"
	"time"
)

// prunable is a kind of row PruneDeleted deletes.
type prunable struct {
	// due selects up to a limit (the second argument) of the rows that
	// ended before a time (the first), oldest first, each by the key its
	// deletes take.
	due string
	// deletes delete one row and the rows keyed by its ID, each taking
	// the row's key.
	deletes []string
	// cached rows are kept by the row cache, which must drop them.
	cached bool
}

// prunables are the kinds of rows PruneDeleted deletes, in the order it
// deletes them. Deleted workspaces and objects keep no label rows and
// their policy references are gone; deleting them anyway keeps every
// pruned row's rule the same.
var prunables = []prunable{
	{
		due: `SELECT project_id, id FROM workspaces WHERE deleted_at IS NOT NULL AND deleted_at < ? ORDER BY deleted_at LIMIT ?`,
		deletes: []string{
			`DELETE FROM object_labels WHERE project_id = ? AND object_id = ?`,
			`DELETE FROM policy_references WHERE project_id = ? AND workspace_id = ?`,
			`DELETE FROM exposures WHERE project_id = ? AND workspace_id = ?`,
			`DELETE FROM sessions WHERE project_id = ? AND workspace_id = ?`,
			`DELETE FROM workspaces WHERE project_id = ? AND id = ?`,
		},
		cached: true,
	},
	{
		due: `SELECT project_id, id FROM volumes WHERE deleted_at IS NOT NULL AND deleted_at < ? ORDER BY deleted_at LIMIT ?`,
		deletes: []string{
			`DELETE FROM object_labels WHERE project_id = ? AND object_id = ?`,
			`DELETE FROM volumes WHERE project_id = ? AND id = ?`,
		},
	},
	{
		due: `SELECT project_id, id FROM transfers WHERE deleted_at IS NOT NULL AND deleted_at < ? ORDER BY deleted_at LIMIT ?`,
		deletes: []string{
			`DELETE FROM object_labels WHERE project_id = ? AND object_id = ?`,
			`DELETE FROM transfers WHERE project_id = ? AND id = ?`,
		},
	},
	{
		// A template's revisions go with it: the ID created again starts
		// with none, as a revived one does.
		due: `SELECT project_id, id FROM objects WHERE deleted_at IS NOT NULL AND deleted_at < ? ORDER BY deleted_at LIMIT ?`,
		deletes: []string{
			`DELETE FROM object_labels WHERE project_id = ? AND object_id = ?`,
			`DELETE FROM template_revisions WHERE project_id = ? AND template_id = ?`,
			`DELETE FROM objects WHERE project_id = ? AND id = ?`,
		},
		cached: true,
	},
	{
		due:     `SELECT project_id, id FROM exposures WHERE ended_at IS NOT NULL AND ended_at < ? ORDER BY ended_at LIMIT ?`,
		deletes: []string{`DELETE FROM exposures WHERE project_id = ? AND id = ?`},
	},
	{
		// The sessions a revoked token issued were revoked with it; their
		// rows name it until they expire and are deleted (DeleteSessions).
		due:     `SELECT project_id, id FROM tokens WHERE revoked_at IS NOT NULL AND revoked_at < ? ORDER BY revoked_at LIMIT ?`,
		deletes: []string{`DELETE FROM tokens WHERE project_id = ? AND id = ?`},
	},
	{
		// A host that registered with a revoked token may name it still:
		// an unknown owner is taken over as a revoked one.
		due:     `SELECT id FROM host_tokens WHERE revoked_at IS NOT NULL AND revoked_at < ? ORDER BY revoked_at LIMIT ?`,
		deletes: []string{`DELETE FROM host_tokens WHERE id = ?`},
	},
}

func (t *tx) PruneDeleted(ctx context.Context, before time.Time, limit int) (int, error) {
	total := 0
	for _, p := range prunables {
		if total >= limit {
			break
		}
		n, err := t.prune(ctx, p, before, limit-total)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// prune deletes up to limit rows of p that ended before before, and
// returns how many it deleted.
func (t *tx) prune(ctx context.Context, p prunable, before time.Time, limit int) (int, error) {
	rows, err := t.query(ctx, p.due, toNanos(before), limit)
	if err != nil {
		return 0, err
	}
	cols, err := rows.Columns()
	if err != nil {
		rows.Close()
		return 0, err
	}
	// Read whole before deleting: a connection runs one statement at a
	// time.
	keys, err := collect(rows, func(row rowScanner) ([]any, error) {
		key := make([]any, len(cols))
		for i := range key {
			key[i] = new(string)
		}
		return key, row.Scan(key...)
	})
	if err != nil {
		return 0, err
	}
	for _, key := range keys {
		for _, stmt := range p.deletes {
			if _, err := t.exec(ctx, stmt, key...); err != nil {
				return 0, err
			}
		}
		if p.cached {
			t.touch(*key[0].(*string), *key[1].(*string))
		}
	}
	return len(keys), nil
}
