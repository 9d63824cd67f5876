package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlite"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlstore"
	"github.com/kibotos/kibotos/internal/ctrl/store/storetest"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "kibotos.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestHostTokensFromBeforeBinding: tokens of a deployment upgraded to
// host tokens that name their hosts go on registering any host.
func TestHostTokensFromBeforeBinding(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kibotos.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	storetest.HostTokensFromBeforeBinding(t, db, func(t *testing.T) store.Store {
		s, err := sqlite.Open(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestReopenKeepsDataAndSkipsApplied opens the same file twice: the second
// open must not re-run migrations and must see what the first stored.
func TestReopenKeepsDataAndSkipsApplied(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kibotos.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	if err := s.View(ctx, func(tx store.Tx) error {
		v, err := tx.Setting(ctx, "k")
		if string(v) != "v" {
			t.Errorf("setting after reopen = %q, %v", v, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestSecondOpenRefused: a store keeps rows in memory, which is only true
// while no other store writes its database, so a second one is refused
// until the first closes.
func TestSecondOpenRefused(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kibotos.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if second, err := sqlite.Open(ctx, path); err == nil || !strings.Contains(err.Error(), "another store has this database open") {
		if err == nil {
			second.Close()
		}
		t.Fatalf("second open: %v, want it refused", err)
	}
	s.Close()
	s, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	s.Close()
}

// TestNewerStoreRefused: a database a newer build migrated (a migration
// this build does not know) is refused, saying so, rather than read and
// rewritten by an older build.
func TestNewerStoreRefused(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kibotos.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, name) VALUES (9999, '9999_from_the_future.sql')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if s, err := sqlite.Open(ctx, path); !errors.Is(err, sqlstore.ErrNewerStore) || !strings.Contains(err.Error(), "9999") {
		if err == nil {
			s.Close()
		}
		t.Fatalf("open of a store with migration 9999: %v, want it refused naming it", err)
	}
}

// TestFullDiskIsErrFull: a change the database's disk has no room for is
// store.ErrFull, which the API answers as resource_exhausted; a read
// still works.
func TestFullDiskIsErrFull(t *testing.T) {
	dir := t.TempDir()
	hosttest.Tmpfs(t, dir, "2m")
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(dir, "kibotos.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	value := make([]byte, 64<<10)
	for i := range 64 {
		err = s.Update(ctx, func(tx store.Tx) error { return tx.PutSetting(ctx, fmt.Sprint("k", i), value) })
		if err != nil {
			break
		}
	}
	if !errors.Is(err, store.ErrFull) {
		t.Fatalf("4 MiB of settings on a 2 MiB disk: %v, want store.ErrFull", err)
	}
	if err := s.View(ctx, func(tx store.Tx) error { _, err := tx.Setting(ctx, "k0"); return err }); err != nil {
		t.Errorf("a read of the full database: %v", err)
	}
}

// TestOpenOnAFullDisk: a database on a disk with no room left fails to
// open as store.ErrFull, saying how much is free, rather than as SQLite's
// "disk I/O error (4874)".
func TestOpenOnAFullDisk(t *testing.T) {
	dir := t.TempDir()
	hosttest.Tmpfs(t, dir, "2m")
	ctx := context.Background()
	path := filepath.Join(dir, "kibotos.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	hosttest.FillDisk(t, dir, 0)
	s, err = sqlite.Open(ctx, path)
	if err == nil {
		s.Close()
		t.Fatal("opened a database on a full disk")
	}
	if !errors.Is(err, store.ErrFull) || !strings.Contains(err.Error(), "0 bytes free") {
		t.Errorf("opening a database on a full disk: %v, want store.ErrFull saying so", err)
	}
}
