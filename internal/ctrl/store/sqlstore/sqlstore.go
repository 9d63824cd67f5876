// Package sqlstore implements store.Store over database/sql. The SQLite and
// PostgreSQL backends share these queries and differ only in a Dialect: how
// placeholders are written, which errors mean "lost a race", and how a
// transaction begins.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Dialect is what differs between SQL backends.
type Dialect struct {
	// Name is the backend's name, for errors.
	Name string
	// NumberedPlaceholders selects $1, $2, ... instead of ?.
	NumberedPlaceholders bool
	// WriteTx is the isolation level of Update transactions.
	WriteTx sql.TxOptions
	// Retryable reports whether err means the transaction lost a race and
	// may run again.
	Retryable func(err error) bool
	// UniqueViolation reports whether err is a unique-key violation.
	UniqueViolation func(err error) bool
	// Full reports whether err means the database's disk is full.
	Full func(err error) bool
	// Unreachable reports whether err means the database did not answer
	// (refused or lost the connection, shutting down).
	Unreachable func(err error) bool
	// GroupCommit runs concurrent Updates in one transaction, each in a
	// savepoint, committed once (see committer). It suits a backend with
	// one writer connection, where Updates run one at a time anyway.
	GroupCommit bool
	// CacheRows keeps the objects and workspaces read by ID in memory
	// (rowCache). It needs GroupCommit, and a database that no other
	// process writes.
	CacheRows bool
}

// maxAttempts bounds how often Update runs a transaction that keeps losing
// races; with serialized writers a few attempts always suffice.
const maxAttempts = 20

// Store is a store.Store over two pools: writes go through write, reads
// through read (they are the same pool when the backend needs no split).
type Store struct {
	read, write *sql.DB
	dialect     Dialect
	group       *committer // with Dialect.GroupCommit
	cache       *rowCache  // with Dialect.CacheRows
}

// New returns a Store. The caller has migrated the schema; Close closes both
// pools.
func New(read, write *sql.DB, d Dialect) *Store {
	s := &Store{read: read, write: write, dialect: d}
	if d.GroupCommit {
		s.group = newCommitter(s)
		if d.CacheRows {
			s.cache = newRowCache()
		}
	}
	return s
}

// Update implements store.Store. A disk too full to store the change is
// store.ErrFull; a database that does not answer, store.ErrUnavailable.
func (s *Store) Update(ctx context.Context, fn func(store.Tx) error) error {
	return s.classify(s.update(ctx, fn))
}

// classify wraps err in store.ErrFull or store.ErrUnavailable when the
// dialect says it is one.
func (s *Store) classify(err error) error {
	switch {
	case err == nil:
		return nil
	case s.dialect.Full != nil && s.dialect.Full(err):
		return fmt.Errorf("%w: %w", store.ErrFull, err)
	case s.dialect.Unreachable != nil && s.dialect.Unreachable(err):
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}

func (s *Store) update(ctx context.Context, fn func(store.Tx) error) error {
	if s.group != nil {
		return s.group.update(ctx, fn)
	}
	var err error
	existsRetried := false
	for attempt := range maxAttempts {
		err = s.run(ctx, s.write, &s.dialect.WriteTx, &tx{d: &s.dialect}, fn)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrExists) && !existsRetried:
			// A key a concurrent transaction inserted first: once that one
			// has committed, a second run sees its row. Another ErrExists
			// is a real duplicate.
			existsRetried = true
		case !s.dialect.Retryable(err):
			return err
		}
		// Back off a little, with jitter, so racing writers spread out.
		delay := time.Duration(attempt+1) * time.Millisecond * time.Duration(1+rand.IntN(4))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
	return fmt.Errorf("%s: transaction kept conflicting after %d attempts: %w", s.dialect.Name, maxAttempts, err)
}

// View implements store.Store. Its reads by ID fill the cache, but only
// ViewCached is served from it: a View runs fn once.
func (s *Store) View(ctx context.Context, fn func(store.Tx) error) error {
	t := &tx{d: &s.dialect}
	if s.cache != nil {
		// Taken before the transaction's snapshot.
		t.cache, t.generation = s.cache, s.cache.begin()
	}
	return s.classify(s.run(ctx, s.read, s.readOptions(), t, fn))
}

// ViewCached implements store.Store.
func (s *Store) ViewCached(ctx context.Context, fn func(store.Tx) error) error {
	if s.cache == nil {
		return s.View(ctx, fn)
	}
	// The transaction begins with the first statement: a read the cache
	// serves alone runs none.
	opts := s.readOptions()
	t := &tx{d: &s.dialect, cache: s.cache, generation: s.cache.begin(), serveCached: true,
		begin: func() (*sql.Tx, error) { return s.read.BeginTx(ctx, opts) }}
	err := fn(t)
	err = s.end(t.tx, err)
	if t.servedFromCache && t.tx != nil && !s.cache.current(t.generation) {
		// A commit started while fn read rows from the cache and others
		// from the database, which may then not be of one moment: run it
		// again on the database alone.
		return s.classify(s.run(ctx, s.read, opts, &tx{d: &s.dialect}, fn))
	}
	return s.classify(err)
}

func (s *Store) readOptions() *sql.TxOptions {
	return &sql.TxOptions{ReadOnly: true, Isolation: s.dialect.WriteTx.Isolation}
}

// run runs fn in a transaction of db, begun for t.
func (s *Store) run(ctx context.Context, db *sql.DB, opts *sql.TxOptions, t *tx, fn func(store.Tx) error) error {
	sqlTx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", s.dialect.Name, err)
	}
	t.tx = sqlTx
	err = fn(t)
	return s.end(sqlTx, err)
}

// end commits sqlTx (if one began) when fn succeeded, and rolls it back
// when fn returned err.
func (s *Store) end(sqlTx *sql.Tx, err error) error {
	if sqlTx == nil {
		return err
	}
	if err != nil {
		_ = sqlTx.Rollback()
		return err
	}
	if err := sqlTx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", s.dialect.Name, err)
	}
	return nil
}

// Close implements store.Store.
func (s *Store) Close() error {
	if s.group != nil {
		s.group.close()
	}
	err := s.write.Close()
	if s.read != s.write {
		err = errors.Join(err, s.read.Close())
	}
	return err
}

// tx implements store.Tx. Like a *sql.Tx it serves one goroutine at a
// time: a transaction of ViewCached begins on its first statement.
type tx struct {
	// tx is nil until the first statement of a ViewCached, which calls
	// begin.
	tx    *sql.Tx
	begin func() (*sql.Tx, error)
	d     *Dialect
	// detached runs statements to completion even when the caller's ctx
	// ends: in a group transaction an interrupted statement could roll
	// back the other members' work.
	detached bool

	// cache, in a read transaction, keeps the rows read by ID from the
	// database under the generation the transaction began with, and with
	// serveCached (ViewCached) serves them; servedFromCache records that
	// it did.
	cache           *rowCache
	generation      uint64
	serveCached     bool
	servedFromCache bool
	// touched, in a group transaction with a cache, collects the rows it
	// writes, for the cache to drop when it commits.
	touched map[rowKey]struct{}
}

// sqlTx returns the transaction, beginning it if it has not begun.
func (t *tx) sqlTx() (*sql.Tx, error) {
	if t.tx == nil {
		sqlTx, err := t.begin()
		if err != nil {
			return nil, fmt.Errorf("%s: begin: %w", t.d.Name, err)
		}
		t.tx = sqlTx
	}
	return t.tx, nil
}

// touch records that the transaction writes the row of projectID and id,
// or its labels.
func (t *tx) touch(projectID, id string) {
	if t.touched != nil {
		t.touched[rowKey{projectID, id}] = struct{}{}
	}
}

// ctx is the context a statement runs under.
func (t *tx) ctx(ctx context.Context) context.Context {
	if t.detached {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// q rewrites ? placeholders for the dialect. Queries here never contain a
// literal question mark.
func (t *tx) q(query string) string {
	if !t.d.NumberedPlaceholders {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (t *tx) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	sqlTx, err := t.sqlTx()
	if err != nil {
		return nil, err
	}
	res, err := sqlTx.ExecContext(t.ctx(ctx), t.q(query), args...)
	if err != nil && t.d.UniqueViolation(err) {
		return nil, fmt.Errorf("%w: %v", store.ErrExists, err)
	}
	return res, err
}

// execCount runs a statement and returns how many rows it changed.
func (t *tx) execCount(ctx context.Context, query string, args ...any) (int, error) {
	res, err := t.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// rowScanner is what a scan function reads one row from: a *sql.Row, the
// *sql.Rows at a row, or errRow.
type rowScanner interface{ Scan(dest ...any) error }

// errRow is a row whose query could not run.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (t *tx) queryRow(ctx context.Context, query string, args ...any) rowScanner {
	sqlTx, err := t.sqlTx()
	if err != nil {
		return errRow{err}
	}
	return sqlTx.QueryRowContext(t.ctx(ctx), t.q(query), args...)
}

func (t *tx) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	sqlTx, err := t.sqlTx()
	if err != nil {
		return nil, err
	}
	return sqlTx.QueryContext(t.ctx(ctx), t.q(query), args...)
}

// notFound maps sql.ErrNoRows to store.ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// mustAffect returns store.ErrNotFound when an update touched no row.
func mustAffect(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// Times are stored as Unix nanoseconds; NULL (or zero) is the zero time.

// toNanos is t in the unit of the time columns, nanoseconds since the
// Unix epoch. A time int64 cannot hold there (before 1678, after 2262)
// is its least or greatest value, so it still orders as it should: a
// deadline in 2300 is never due.
func toNanos(t time.Time) int64 {
	switch {
	case t.Before(minNanosTime):
		return math.MinInt64
	case t.After(maxNanosTime):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// minNanosTime and maxNanosTime are the times toNanos holds exactly.
var minNanosTime, maxNanosTime = time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)

func nullNanos(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: toNanos(t), Valid: true}
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

func fromNullNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return fromNanos(n.Int64)
}

// blob stores nil as an empty value: NOT NULL columns hold "no bytes" too.
func blob(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
