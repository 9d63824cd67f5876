// Package postgres is the multi-node store backend: PostgreSQL through pgx.
// Several ctrl replicas share one database; transactions are SERIALIZABLE,
// and the ones that lose a race are retried by the shared SQL layer.
package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the advisory lock key replicas take while migrating.
const migrationLock = `SELECT pg_advisory_xact_lock(7316585741)`

var dialect = sqlstore.Dialect{
	Name:                 "postgres",
	NumberedPlaceholders: true,
	WriteTx:              sql.TxOptions{Isolation: sql.LevelSerializable},
	Retryable: func(err error) bool {
		// serialization_failure, deadlock_detected
		return pgCode(err) == "40001" || pgCode(err) == "40P01"
	},
	UniqueViolation: func(err error) bool { return pgCode(err) == "23505" },
	Full:            func(err error) bool { return pgCode(err) == "53100" }, // disk_full
	Unreachable:     unreachable,
}

// unreachable reports whether err means the server did not answer: a
// connection refused or lost, a connection exception (class 08), a server
// shutting down or starting (57P01 to 57P03), or a session the server
// ended for idling in its transaction (25P03: the process stalled).
func unreachable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // the caller's context ended (it is a net.Error too)
	}
	var connect *pgconn.ConnectError
	var netErr net.Error
	code := pgCode(err)
	return errors.As(err, &connect) || errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, driver.ErrBadConn) || strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03" || code == "25P03"
}

func pgCode(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// maxIdleConns is how many connections stay open between transactions.
const maxIdleConns = 64

// idleInTransactionTimeout ends, on the server, a session that holds a
// transaction open without sending anything for that long, and so frees
// its locks: a replica that froze (a paused VM, a cut network) inside a
// write would otherwise hold the rows it wrote, and stall every
// replica's passes over them (host leases, expirations), for as long as it
// stays frozen. The store's transactions do no other work while open, so
// none idles that long unless its process stopped. A database URL that
// sets the parameter itself, as a parameter or in its options (or
// PGOPTIONS), keeps its value.
const idleInTransactionTimeout = "15s"

// Open connects to the database at url (postgres://...) and applies pending
// migrations.
func Open(ctx context.Context, url string) (store.Store, error) {
	config, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	const idleParam = "idle_in_transaction_session_timeout"
	if _, set := config.RuntimeParams[idleParam]; !set && !strings.Contains(config.RuntimeParams["options"], idleParam) {
		config.RuntimeParams[idleParam] = idleInTransactionTimeout
	}
	db := stdlib.OpenDB(*config)
	// A new connection costs a round trip of authentication and a backend
	// process: keep as many idle as busy callers use.
	db.SetMaxIdleConns(maxIdleConns)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := sqlstore.New(db, db, dialect)
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := sqlstore.Migrate(ctx, s, sub, migrationLock); err != nil {
		s.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return s, nil
}
