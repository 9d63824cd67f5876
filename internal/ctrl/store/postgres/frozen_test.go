package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestFrozenWriterFreesItsLocks: a replica that stops inside a write
// transaction (here, its fn blocks) loses that transaction once it has
// sent nothing for the idle timeout, so another replica's write of the
// same row goes through instead of waiting for as long as the first stays
// frozen.
func TestFrozenWriterFreesItsLocks(t *testing.T) {
	t.Parallel()
	// The default, 15 s, and a URL's own, in its options: the row is
	// freed within 10 s only if the URL's 1 s holds.
	dbURL := testutil.PostgresDatabase(t)
	t.Run("default", func(t *testing.T) { frozenWriter(t, dbURL, 45*time.Second) })
	t.Run("the URL's options", func(t *testing.T) {
		frozenWriter(t, dbURL+"&options=-c%20idle_in_transaction_session_timeout%3D1s", 10*time.Second)
	})
}

// frozenWriter freezes a writer of a row of the database at dbURL and
// checks that another writes it within bound, and that the frozen one's
// write fails as a database that does not answer.
func frozenWriter(t *testing.T, dbURL string, bound time.Duration) {
	frozen, other := testutil.OpenPostgres(t, dbURL), testutil.OpenPostgres(t, dbURL)
	ctx := context.Background()
	if err := other.Update(ctx, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte("0")) }); err != nil {
		t.Fatal(err)
	}

	thaw, locked, thawed := make(chan struct{}), make(chan struct{}, 1), make(chan error, 1)
	go func() {
		thawed <- frozen.Update(ctx, func(tx store.Tx) error {
			if err := tx.PutSetting(ctx, "k", []byte("frozen")); err != nil {
				return err
			}
			select {
			case locked <- struct{}{}:
			default:
			}
			<-thaw
			return nil
		})
	}()
	<-locked

	bounded, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := time.Now()
	err := other.Update(bounded, func(tx store.Tx) error { return tx.PutSetting(bounded, "k", []byte("other")) })
	close(thaw)
	if err != nil {
		t.Fatalf("a write of the row a frozen replica holds: %v after %s", err, time.Since(start).Round(time.Second))
	}
	if err := <-thawed; !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("the frozen replica's write, once thawed: %v, want store.ErrUnavailable", err)
	}
}
