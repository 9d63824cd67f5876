package sqlite

import (
	"context"
	"database/sql/driver"
	"strings"

	sqlite "modernc.org/sqlite"
)

// maxCachedStatements bounds the prepared statements one connection keeps.
const maxCachedStatements = 256

// connector opens connections that keep their prepared statements:
// parsing and planning a statement costs SQLite about as much as running
// one of ctrl's small queries, and the driver otherwise prepares every
// statement anew, its BEGIN and COMMIT included.
type connector struct {
	dsn string
	// immediate begins writing transactions with BEGIN IMMEDIATE, which
	// takes the write lock at once rather than at the first write.
	immediate bool
}

func (c connector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.Driver().Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &cachingConn{conn: conn.(sqliteConn), stmts: map[string]*cachedStmt{}, immediate: c.immediate}, nil
}

func (connector) Driver() driver.Driver { return &sqlite.Driver{} }

// sqliteConn is what database/sql uses of the driver's connections.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.SessionResetter
	driver.Validator
}

// cachingConn runs single statements through prepared statements kept by
// their text. database/sql uses a connection from one goroutine at a time.
//
// A statement's context is checked before it runs, not watched while it
// runs: the driver watches a cancellable context with a goroutine per
// statement, which costs more than ctrl's statements themselves, each of
// which reads or writes a bounded number of rows. A cancelled call thus
// stops at its next statement.
type cachingConn struct {
	conn      sqliteConn
	stmts     map[string]*cachedStmt
	immediate bool
}

type cachedStmt struct {
	stmt driver.Stmt
	// busy is set while rows of the statement are open: a second query
	// of the same text then gets a statement of its own.
	busy bool
}

// stmt returns the cached statement for query, preparing it on first
// use; nil when query is not cached (a script, a full cache, or the
// statement is busy).
func (c *cachingConn) stmt(ctx context.Context, query string) (*cachedStmt, error) {
	if s, ok := c.stmts[query]; ok {
		if s.busy {
			return nil, nil
		}
		return s, nil
	}
	if strings.Contains(query, ";") || len(c.stmts) >= maxCachedStatements {
		return nil, nil
	}
	st, err := c.conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s := &cachedStmt{stmt: st}
	c.stmts[query] = s
	return s, nil
}

func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	s, err := c.stmt(ctx, query)
	if err != nil || s == nil {
		if err != nil {
			return nil, err
		}
		return c.conn.QueryContext(ctx, query, args)
	}
	rows, err := s.stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	s.busy = true
	return &cachedRows{Rows: rows, stmt: s}, nil
}

func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	s, err := c.stmt(ctx, query)
	if err != nil || s == nil {
		if err != nil {
			return nil, err
		}
		return c.conn.ExecContext(ctx, query, args)
	}
	return s.stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (c *cachingConn) Close() error {
	for _, s := range c.stmts {
		s.stmt.Close()
	}
	return c.conn.Close()
}

func (c *cachingConn) Prepare(query string) (driver.Stmt, error) { return c.conn.Prepare(query) }

func (c *cachingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.conn.PrepareContext(ctx, query)
}

func (c *cachingConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx runs BEGIN through the cache; the transaction's COMMIT and
// ROLLBACK do too.
func (c *cachingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	begin := "BEGIN"
	if c.immediate && !opts.ReadOnly {
		begin = "BEGIN IMMEDIATE"
	}
	if _, err := c.ExecContext(ctx, begin, nil); err != nil {
		return nil, err
	}
	return cachedTx{c}, nil
}

func (c *cachingConn) ResetSession(ctx context.Context) error { return c.conn.ResetSession(ctx) }

func (c *cachingConn) IsValid() bool { return c.conn.IsValid() }

// cachedTx ends a transaction BeginTx began.
type cachedTx struct{ c *cachingConn }

// Commit commits, or rolls back when COMMIT fails: database/sql expects
// the connection outside any transaction afterwards.
func (t cachedTx) Commit() error {
	_, err := t.c.ExecContext(context.Background(), "COMMIT", nil)
	if err != nil {
		_ = t.Rollback() // fails harmlessly when COMMIT ended the transaction
	}
	return err
}

func (t cachedTx) Rollback() error {
	_, err := t.c.ExecContext(context.Background(), "ROLLBACK", nil)
	return err
}

// cachedRows frees its statement for the next query when closed.
type cachedRows struct {
	driver.Rows
	stmt *cachedStmt
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	r.stmt.busy = false
	return err
}
