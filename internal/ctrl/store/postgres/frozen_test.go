package postgres_test

import (
	"context"
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
	dbURL := testutil.PostgresDatabase(t)
	frozen, other := testutil.OpenPostgres(t, dbURL), testutil.OpenPostgres(t, dbURL)
	ctx := context.Background()
	if err := other.Update(ctx, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte("0")) }); err != nil {
		t.Fatal(err)
	}

	thaw, locked, thawed := make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
	defer func() { close(thaw); <-thawed }()
	go func() {
		defer close(thawed)
		frozen.Update(ctx, func(tx store.Tx) error {
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

	// Well past the 15 s timeout: without it the write waits for good.
	bounded, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	start := time.Now()
	if err := other.Update(bounded, func(tx store.Tx) error { return tx.PutSetting(bounded, "k", []byte("other")) }); err != nil {
		t.Fatalf("a write of the row a frozen replica holds: %v after %s", err, time.Since(start).Round(time.Second))
	}
}
