package accesslog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// TestSharedErrorsHaveOneAnswer: errors any call may meet are answered
// alike, without the database's words, whichever layer returned them; a
// call whose caller went away is canceled, not an internal error.
func TestSharedErrorsHaveOneAnswer(t *testing.T) {
	var log bytes.Buffer
	i := &Interceptor{Logger: slog.New(slog.NewTextHandler(&log, nil))}
	call := func(ctx context.Context, err error) error {
		_, got := i.WrapUnary(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, err })(
			ctx, connect.NewRequest(&emptypb.Empty{}))
		return got
	}
	full := fmt.Errorf("%w: sqlite /var/lib/kibotos/kibotos.db: database or disk is full (13)", store.ErrFull)
	down := fmt.Errorf("%w: postgres: begin: failed to connect to `user=kibotos database=kib`", store.ErrUnavailable)
	for _, c := range []struct {
		what      string
		err       error
		code      connect.Code
		say, hide string
	}{
		{"a full store, from a handler", Internal(full), connect.CodeResourceExhausted, "no disk space left", "/var/lib"},
		{"a store that does not answer, from a handler", Internal(down), connect.CodeUnavailable, "does not answer; retry shortly", "user="},
		{"a store that does not answer, from the token's check", connect.NewError(connect.CodeUnavailable, fmt.Errorf("authenticate: %w", down)),
			connect.CodeUnavailable, "does not answer; retry shortly", "user="},
		{"another error", Internal(errors.New("sqlite /var/lib/kibotos/kibotos.db: locked")), connect.CodeInternal, "see the server log", "/var/lib"},
	} {
		err := call(context.Background(), c.err)
		if connect.CodeOf(err) != c.code || !strings.Contains(err.Error(), c.say) || strings.Contains(err.Error(), c.hide) {
			t.Errorf("%s: %v, want %v saying %q, not %q", c.what, err, c.code, c.say, c.hide)
		}
	}

	log.Reset()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := call(gone, Internal(fmt.Errorf("postgres: begin: %w", context.Canceled))); connect.CodeOf(err) != connect.CodeCanceled {
		t.Errorf("a call its caller abandoned: %v, want canceled", err)
	}
	if strings.Contains(log.String(), "internal error") || !strings.Contains(log.String(), "code=canceled") {
		t.Errorf("a call its caller abandoned was logged as:\n%s", log.String())
	}
}
