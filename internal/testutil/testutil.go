// Package testutil opens real stores for tests: a fresh SQLite file, or a
// fresh database on the PostgreSQL server that scripts/test-postgres starts;
// it builds binaries of this module (the guest agent for a TestMain);
// SyncBuffer collects a stream's output while a test reads it; H2CServer
// serves a handler over HTTP/1.1 and cleartext HTTP/2, ServeOnce one
// loopback TCP connection, ClosedURL names a loopback port nothing serves,
// and Do sends a request and reads its answer;
// WantCode and ErrorDetail read the Connect errors of the API, RetentionTier
// a workspace's tier of one kind; HelloImage builds, and HelloImageArchive writes, an image a
// deployment can import and run.
// Its sub-packages hold the other helpers every package's tests share (the
// in-process control plane, host skips and root filesystems, a fake
// resolver, test certificates, a test "internet", long DNS names).
package testutil

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/postgres"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlite"
)

// PostgresEnv names the variable holding the test server's URL.
const PostgresEnv = "KIBOTOS_TEST_POSTGRES"

// SQLiteStore opens a store in a new file that the test removes.
func SQLiteStore(t testing.TB) store.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "kibotos.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// PostgresStore creates a database on the server named by
// KIBOTOS_TEST_POSTGRES, opens a store on it, and drops it when the test
// ends. Without the variable the test is skipped; `make test` sets it.
func PostgresStore(t testing.TB) store.Store {
	t.Helper()
	return OpenPostgres(t, PostgresDatabase(t))
}

// OpenPostgres opens a store on the database at dbURL (as another ctrl
// replica would) and closes it when the test ends.
func OpenPostgres(t testing.TB, dbURL string) store.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// PostgresDatabase creates a database on the server named by
// KIBOTOS_TEST_POSTGRES and returns its URL; the database is dropped when
// the test ends, after the cleanups registered later (the stores on it).
// Without the variable the test is skipped.
func PostgresDatabase(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(PostgresEnv)
	if admin == "" {
		t.Skipf("%s is not set; `make test` starts a server (scripts/test-postgres)", PostgresEnv)
	}
	ctx := context.Background()
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	name := "kibotos_test_" + ids.New("db")[3:]
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	t.Cleanup(func() {
		db, err := sql.Open("pgx", admin)
		if err != nil {
			t.Error(err)
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})
	return u.String()
}
