package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

// ErrNewerStore is Migrate's refusal of a store migrated by a newer build.
var ErrNewerStore = errors.New("the store was migrated by a newer Kibotos")

// Migrate applies the migrations in fsys that db has not applied yet, in
// version order, in one transaction. Files are named NNNN_name.sql; a
// version once applied is never run again, so a released file must never
// change. lock, when not empty, is run first inside the transaction so that
// replicas starting together migrate one at a time. A store that has a
// migration fsys lacks is refused (ErrNewerStore).
func Migrate(ctx context.Context, s *Store, fsys fs.FS, lock string) error {
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return err
	}
	type migration struct {
		version int
		name    string
	}
	var all []migration
	for _, f := range files {
		v, _, ok := strings.Cut(path.Base(f), "_")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			return fmt.Errorf("migration %s: name must start with a version number", f)
		}
		all = append(all, migration{n, f})
	}
	slices.SortFunc(all, func(a, b migration) int { return a.version - b.version })

	sqlTx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer sqlTx.Rollback() //nolint:errcheck // a no-op after Commit
	t := &tx{tx: sqlTx, d: &s.dialect}
	if lock != "" {
		if _, err := t.exec(ctx, lock); err != nil {
			return fmt.Errorf("migration lock: %w", err)
		}
	}
	if _, err := t.exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version BIGINT PRIMARY KEY, name TEXT NOT NULL)`); err != nil {
		return err
	}
	rows, err := t.query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return err
	}
	applied, err := collect(rows, func(row rowScanner) (int, error) {
		var v int
		return v, row.Scan(&v)
	})
	if err != nil {
		return err
	}
	// A store a newer build migrated holds what this one would misread
	// (or rewrite without): refuse it rather than run a downgrade.
	for _, v := range applied {
		if !slices.ContainsFunc(all, func(m migration) bool { return m.version == v }) {
			return fmt.Errorf("%w: it has migration %d, which this build does not know (it knows up to %d): run the build that migrated it, or a newer one",
				ErrNewerStore, v, all[len(all)-1].version)
		}
	}
	for _, m := range all {
		if slices.Contains(applied, m.version) {
			continue
		}
		body, err := fs.ReadFile(fsys, m.name)
		if err != nil {
			return err
		}
		if _, err := sqlTx.ExecContext(ctx, string(body)); err != nil {
			return fmt.Errorf("migration %s: %w", m.name, err)
		}
		if _, err := t.exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES (?, ?)`, m.version, m.name); err != nil {
			return err
		}
	}
	return sqlTx.Commit()
}
