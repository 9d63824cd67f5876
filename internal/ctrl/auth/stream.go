package auth

import (
	"context"
	"time"

	"connectrpc.com/connect"
)

// WhileAuthenticated runs a stream's handler with a context that ends once
// check, made again every period while the stream lasts, refuses the
// caller as unauthenticated; the stream then ends with that refusal rather
// than the handler's own error. Any other failure of check (a store that
// does not answer) ends nothing: the check is made again.
func WhileAuthenticated(ctx context.Context, every time.Duration, check func(context.Context) error, handler func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := check(ctx); connect.CodeOf(err) == connect.CodeUnauthenticated {
				cancel(err)
				return
			}
		}
	}()
	err := handler(ctx)
	if cause := context.Cause(ctx); connect.CodeOf(cause) == connect.CodeUnauthenticated {
		return cause
	}
	return err
}
