package api

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"
)

// TestRespondHidesOtherErrors: a canonical Connect error passes through;
// any other is internal, without its text.
func TestRespondHidesOtherErrors(t *testing.T) {
	refused := connect.NewError(connect.CodeNotFound, errors.New("egress egr_x not found"))
	if _, err := Respond[struct{}](nil, refused); !errors.Is(err, refused) {
		t.Errorf("a canonical error: %v, want it as it is", err)
	}
	_, err := Respond[struct{}](nil, errors.New("sqlite /var/lib/kibotos/kibotos.db: database is locked"))
	if connect.CodeOf(err) != connect.CodeInternal || strings.Contains(err.Error(), "/var/lib") {
		t.Errorf("another error: %v, want internal, naming no path", err)
	}
}
