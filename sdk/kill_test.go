package sdk

import (
	"context"
	"errors"
	"net"
	"testing"

	"connectrpc.com/connect"
)

// Exec's kill is sent again while the data plane cannot be reached (a
// deployment that restarts), and not when it answered.
func TestKillWhenReached(t *testing.T) {
	unreachable := connect.NewError(connect.CodeUnavailable, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
	calls := 0
	err := killWhenReached(t.Context(), func(context.Context) error {
		if calls++; calls <= 2 {
			return unreachable
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("kill through a restart: %v after %d calls, want success at the third", err, calls)
	}

	answered := connect.NewError(connect.CodeUnavailable, errors.New("workspace ws_1 is not running on this host"))
	calls = 0
	if err := killWhenReached(t.Context(), func(context.Context) error { calls++; return answered }); err != answered || calls != 1 {
		t.Errorf("a kill the data plane answered: %v after %d calls, want its answer at once", err, calls)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 3*killRetry)
	defer cancel()
	calls = 0
	if err := killWhenReached(ctx, func(context.Context) error { calls++; return unreachable }); !notReached(err) || calls < 2 {
		t.Errorf("a data plane never reached: %v after %d calls, want the dial's error after a few", err, calls)
	}
	if ctx.Err() == nil {
		t.Error("killWhenReached returned before its context ended")
	}
}
