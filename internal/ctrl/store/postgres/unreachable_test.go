package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestUnreachableServer: reads and writes of a store whose server went
// away are store.ErrUnavailable (which the API answers unavailable), not
// an error the API would call internal.
func TestUnreachableServer(t *testing.T) {
	u, err := url.Parse(testutil.PostgresDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	r := testutil.NewRelay(t, u.Host)
	u.Host = r.Addr()
	s := testutil.OpenPostgres(t, u.String())
	ctx := context.Background()
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	// A caller whose deadline passed is not told the store is away
	// (context.DeadlineExceeded is a net.Error too).
	ended, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if err := s.View(ended, func(tx store.Tx) error { _, err := tx.Setting(ended, "k"); return err }); errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a read with its context ended: %v, want no store.ErrUnavailable", err)
	}
	r.Cut()
	for name, call := range map[string]func() error{
		"update": func() error {
			return s.Update(ctx, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte("w")) })
		},
		"view": func() error {
			return s.View(ctx, func(tx store.Tx) error { _, err := tx.Setting(ctx, "k"); return err })
		},
	} {
		if err := call(); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s on a server gone: %v, want store.ErrUnavailable", name, err)
		}
	}
}
