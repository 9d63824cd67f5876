package api

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// TestRespondMapsStoreErrors: a change the database had no disk space for
// is resource_exhausted, and a call it did not answer unavailable, each
// saying so without the database's own words; any other store error stays
// internal.
func TestRespondMapsStoreErrors(t *testing.T) {
	_, err := Respond[struct{}](nil, fmt.Errorf("%w: sqlite /var/lib/kibotos/kibotos.db: database or disk is full (13)", store.ErrFull))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "no disk space") || strings.Contains(err.Error(), "/var/lib") {
		t.Errorf("a full store: %v, want resource_exhausted saying so, naming no path", err)
	}
	if _, err := Respond[struct{}](nil, errors.New("sqlite: database is locked")); connect.CodeOf(err) != connect.CodeInternal {
		t.Errorf("another store error: %v, want internal", err)
	}
	_, err = Respond[struct{}](nil, fmt.Errorf("%w: postgres: begin: failed to connect to `user=kibotos`: dial error", store.ErrUnavailable))
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "retry") || strings.Contains(err.Error(), "kibotos`") {
		t.Errorf("a store that does not answer: %v, want unavailable saying to retry, without the database's details", err)
	}
}
