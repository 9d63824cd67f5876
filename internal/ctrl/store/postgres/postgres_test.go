package postgres_test

import (
	"testing"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/storetest"
	"github.com/kibotos/kibotos/internal/testutil"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return testutil.PostgresStore(t) })
}
