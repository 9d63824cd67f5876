package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/postgres"
	"github.com/kibotos/kibotos/internal/ctrl/store/storetest"
	"github.com/kibotos/kibotos/internal/testutil"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return testutil.PostgresStore(t) })
}

// TestHostTokensFromBeforeBinding: tokens of a deployment upgraded to
// host tokens that name their hosts go on registering any host.
func TestHostTokensFromBeforeBinding(t *testing.T) {
	url := testutil.PostgresDatabase(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	storetest.HostTokensFromBeforeBinding(t, db, func(t *testing.T) store.Store {
		s, err := postgres.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
