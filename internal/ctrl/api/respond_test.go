package api

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// TestRespondMapsAFullStore: a change the database had no disk space for
// is resource_exhausted, saying so without the database's own words; any
// other store error stays internal.
func TestRespondMapsAFullStore(t *testing.T) {
	_, err := Respond[struct{}](nil, fmt.Errorf("%w: sqlite /var/lib/kibotos/kibotos.db: database or disk is full (13)", store.ErrFull))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "no disk space") || strings.Contains(err.Error(), "/var/lib") {
		t.Errorf("a full store: %v, want resource_exhausted saying so, naming no path", err)
	}
	if _, err := Respond[struct{}](nil, errors.New("sqlite: database is locked")); connect.CodeOf(err) != connect.CodeInternal {
		t.Errorf("another store error: %v, want internal", err)
	}
}
