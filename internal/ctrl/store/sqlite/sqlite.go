// Package sqlite is the embedded store backend: one SQLite database file in
// WAL mode, through the pure-Go modernc.org/sqlite driver (no cgo).
//
// Writes go through a single connection, so SQLite's one writer is queued in
// Go rather than spun on busy retries; reads use their own pool and run
// concurrently with the writer, as WAL allows. The store holds the database
// file alone (an exclusive lock, released when it closes or its process
// ends), which lets it keep the rows it reads by ID in memory.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

var dialect = sqlstore.Dialect{
	Name:        "sqlite",
	GroupCommit: true,
	CacheRows:   true,
	Retryable: func(err error) bool {
		var e *sqlite.Error
		return errors.As(err, &e) && (e.Code()&0xff == sqlite3.SQLITE_BUSY || e.Code()&0xff == sqlite3.SQLITE_LOCKED)
	},
	UniqueViolation: func(err error) bool {
		var e *sqlite.Error
		return errors.As(err, &e) &&
			(e.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || e.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
	},
	Full: func(err error) bool {
		var e *sqlite.Error
		return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_FULL
	},
}

// maxIdleReaders is how many read connections stay open between reads.
const maxIdleReaders = 64

// Open opens (creating if needed) the database at path and applies pending
// migrations. It fails while another store, of this process or another,
// has the database open.
func Open(ctx context.Context, path string) (store.Store, error) {
	lock, err := lockFile(path)
	if err != nil {
		return nil, err
	}
	s, err := open(ctx, path)
	if err != nil {
		lock.Close()
		return nil, err
	}
	return &lockedStore{Store: s, lock: lock}, nil
}

// lockFile takes an exclusive lock on the database file (creating it
// empty, which SQLite takes for a new database). SQLite's own locks are
// POSIX record locks, which this lock does not touch.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("sqlite %s: another store has this database open (is another kibotos running on this home?)", path)
		}
		return nil, fmt.Errorf("sqlite %s: lock: %w", path, err)
	}
	return f, nil
}

// lockedStore releases the database file's lock when it closes.
type lockedStore struct {
	*sqlstore.Store
	lock *os.File
}

func (s *lockedStore) Close() error {
	return errors.Join(s.Store.Close(), s.lock.Close())
}

func open(ctx context.Context, path string) (*sqlstore.Store, error) {
	dsn := func(extra string) string {
		return "file:" + url.PathEscape(path) +
			"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)" +
			"&_pragma=synchronous(FULL)" + extra
	}
	write := sql.OpenDB(connector{dsn: dsn(""), immediate: true})
	write.SetMaxOpenConns(1)
	read := sql.OpenDB(connector{dsn: dsn("&_pragma=query_only(1)")})
	// Opening a connection runs the pragmas and reads the schema, which
	// costs more than most reads: keep as many idle as there are readers.
	// The pool is not capped, so a View inside a View never waits.
	read.SetMaxIdleConns(maxIdleReaders)
	s := sqlstore.New(read, write, dialect)
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := sqlstore.Migrate(ctx, s, sub, ""); err != nil {
		s.Close()
		if free, ok := freeBytes(filepath.Dir(path)); ok && free < minFreeToOpen {
			// SQLite says "disk I/O error" when it cannot make its
			// shared-memory file, the first thing it writes.
			return nil, fmt.Errorf("sqlite %s: %w (%d bytes free; free space on it and start again): %w", path, store.ErrFull, free, err)
		}
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	return s, nil
}

// minFreeToOpen is the free space below which a failure to open the
// database is taken for a full disk.
const minFreeToOpen = 1 << 20

// freeBytes returns the space free to unprivileged users on dir's
// filesystem.
func freeBytes(dir string) (uint64, bool) {
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) != nil {
		return 0, false
	}
	return fs.Bavail * uint64(fs.Bsize), true
}
