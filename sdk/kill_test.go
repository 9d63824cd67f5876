package sdk

import (
	"context"
	"errors"
	"net"
	"testing"

	"connectrpc.com/connect"
)

// Exec's kill is sent again while the data plane cannot be reached (a
// deployment that restarts), and while it answers unavailable but the
// execution runs on (a host agent just restarted, out of service); a kill
// refused unavailable because the execution ended is done at once.
func TestKillWhileItMayRun(t *testing.T) {
	unreachable := connect.NewError(connect.CodeUnavailable, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
	outOfService := connect.NewError(connect.CodeUnavailable, errors.New("this host is out of service: it has not registered with the control plane since it started"))
	runs := func(context.Context) bool { return false }
	calls, asked := 0, 0
	err := killWhileItMayRun(t.Context(), func(context.Context) error {
		switch calls++; calls {
		case 1:
			return unreachable
		case 2:
			return outOfService
		}
		return nil
	}, func(context.Context) bool { asked++; return false })
	if err != nil || calls != 3 || asked != 1 {
		t.Errorf("kill through a restart: %v after %d calls asking the control plane %d times, want success at the third after asking once", err, calls, asked)
	}

	notRunning := connect.NewError(connect.CodeUnavailable, errors.New("workspace ws_1 is not running on this host; retry once it runs"))
	calls = 0
	if err := killWhileItMayRun(t.Context(), func(context.Context) error { calls++; return notRunning }, func(context.Context) bool { return true }); err != nil || calls != 1 {
		t.Errorf("a kill refused for an execution that ended: %v after %d calls, want done at once", err, calls)
	}

	answered := connect.NewError(connect.CodeFailedPrecondition, errors.New("no such signal"))
	calls = 0
	if err := killWhileItMayRun(t.Context(), func(context.Context) error { calls++; return answered }, runs); err != answered || calls != 1 {
		t.Errorf("a kill the data plane answered: %v after %d calls, want its answer at once", err, calls)
	}

	for _, refusal := range []error{unreachable, outOfService} {
		ctx, cancel := context.WithTimeout(t.Context(), 3*killRetry)
		calls = 0
		if err := killWhileItMayRun(ctx, func(context.Context) error { calls++; return refusal }, runs); err != refusal || calls < 2 {
			t.Errorf("a kill refused until the end: %v after %d calls, want %v after a few", err, calls, refusal)
		}
		if ctx.Err() == nil {
			t.Error("killWhileItMayRun returned before its context ended")
		}
		cancel()
	}
}
