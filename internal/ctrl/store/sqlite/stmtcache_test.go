package sqlite

import (
	"database/sql"
	"path/filepath"
	"testing"
)

// TestCachedStatementWhileItsRowsAreOpen runs a query again while rows of
// the first run are still open: the second run gets a statement of its
// own, and both read every row; afterwards the cached one serves again.
func TestCachedStatementWhileItsRowsAreOpen(t *testing.T) {
	db := sql.OpenDB(connector{"file:" + filepath.Join(t.TempDir(), "t.db")})
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
