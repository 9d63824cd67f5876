package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestCachedStatementWhileItsRowsAreOpen runs a query again while rows of
// the first run are still open: the second run gets a statement of its
// own, and both read every row; afterwards the cached one serves again.
func TestCachedStatementWhileItsRowsAreOpen(t *testing.T) {
	db := sql.OpenDB(connector{dsn: "file:" + filepath.Join(t.TempDir(), "t.db")})
	defer db.Close()
	db.SetMaxOpenConns(1)
	const q = `SELECT value FROM json_each('[1,2,3]') WHERE value >= ?`
	sum := func(rows *sql.Rows) int {
		t.Helper()
		defer rows.Close()
		n := 0
		for rows.Next() {
			var v int
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			n += v
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	outer, err := tx.Query(q, 1)
	if err != nil {
		t.Fatal(err)
	}
	outer.Next()
	inner, err := tx.Query(q, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(inner); got != 5 {
		t.Errorf("inner query sum = %d, want 5", got)
	}
	if got := sum(outer); got != 5 { // 2 + 3 after the first row
		t.Errorf("outer query rest = %d, want 5", got)
	}
	for range 3 {
		rows, err := tx.Query(q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := sum(rows); got != 6 {
			t.Errorf("cached query sum = %d, want 6", got)
		}
	}
}

// TestCancelledContextStopsTheNextStatement: a statement under a done
// context does not run, and the transaction still rolls back cleanly.
func TestCancelledContextStopsTheNextStatement(t *testing.T) {
	db := sql.OpenDB(connector{dsn: "file:" + filepath.Join(t.TempDir(), "t.db")})
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE t (x)`); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := tx.ExecContext(ctx, `INSERT INTO t VALUES (1)`); !errors.Is(err, context.Canceled) {
		t.Fatalf("insert under a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := db.BeginTx(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("begin under a cancelled context: %v, want context.Canceled", err)
	}
	_ = tx.Rollback()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name = 't'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after rollback: %d tables t, %v; want none", n, err)
	}
}

// TestWritingTransactionTakesTheWriteLockAtBegin: with immediate, a
// writing transaction holds the write lock from BEGIN, so a second one
// fails at its BEGIN rather than at its first write; a read-only one does
// not take it.
func TestWritingTransactionTakesTheWriteLockAtBegin(t *testing.T) {
	dsn := "file:" + filepath.Join(t.TempDir(), "t.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(0)"
	first := sql.OpenDB(connector{dsn: dsn, immediate: true})
	defer first.Close()
	second := sql.OpenDB(connector{dsn: dsn, immediate: true})
	defer second.Close()
	ctx := context.Background()
	tx, err := first.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := second.BeginTx(ctx, nil); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second writing BEGIN: %v, want database is locked", err)
	}
	read, err := second.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only BEGIN beside a writer: %v", err)
	}
	read.Rollback()
}

// TestFailedCommitLeavesNoTransaction: a COMMIT that fails (here on a
// deferred foreign key) rolls back, so the connection begins anew.
func TestFailedCommitLeavesNoTransaction(t *testing.T) {
	db := sql.OpenDB(connector{dsn: "file:" + filepath.Join(t.TempDir(), "t.db") + "?_pragma=foreign_keys(1)"})
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`CREATE TABLE p (id INTEGER PRIMARY KEY);
		CREATE TABLE c (p INTEGER REFERENCES p (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO c VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("commit of a dangling reference succeeded")
	}
	tx, err = db.Begin()
	if err != nil {
		t.Fatalf("begin after a failed commit: %v", err)
	}
	var n int
	if err := tx.QueryRow(`SELECT count(*) FROM c`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after the failed commit: %d, %v; want 0", n, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}
