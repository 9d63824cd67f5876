package storetest

import (
	"database/sql"
	"testing"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// HostTokensFromBeforeBinding checks migration 0013, which made host
// tokens name the host IDs they may register: a token issued before it
// may register any host after it, as it could before, and a token issued
// after it keeps what it was issued with. open opens (and migrates) a
// store on the database db reaches; the test closes each store it opens.
func HostTokensFromBeforeBinding(t *testing.T, db *sql.DB, open func(*testing.T) store.Store) {
	s := open(t)
	s.Close()
	// The database as migration 0012 left it, with a token issued then.
	for _, stmt := range []string{
		`ALTER TABLE host_tokens DROP COLUMN host_ids`,
		`ALTER TABLE host_tokens DROP COLUMN any_host`,
		`DELETE FROM schema_migrations WHERE version = 13`,
		`INSERT INTO host_tokens (id, name, secret_hash, created_at) VALUES ('htk_old', 'old', 'hash', 1)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	s = open(t)
	defer s.Close()
	update(t, s, func(tx store.Tx) error {
		return tx.CreateHostToken(ctx, store.HostToken{ID: "htk_new", SecretHash: []byte("h"), CreatedAt: now, HostIDs: []string{"h1"}})
	})
	view(t, s, func(tx store.Tx) error {
		old, err := tx.HostToken(ctx, "htk_old")
		if err != nil || !old.AnyHost || len(old.HostIDs) != 0 {
			t.Errorf("a host token of before the migration = %+v, %v; want it to register any host", old, err)
		}
		bound, err := tx.HostToken(ctx, "htk_new")
		if err != nil || bound.AnyHost || len(bound.HostIDs) != 1 {
			t.Errorf("a host token bound to h1 = %+v, %v", bound, err)
		}
		return nil
	})
}
