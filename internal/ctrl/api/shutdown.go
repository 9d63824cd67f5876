package api

import (
	"context"
	"errors"

	"connectrpc.com/connect"
)

// shutdownKey carries, in the context of every request a server serves,
// the channel it closes when it begins to shut down (server.Serve).
type shutdownKey struct{}

// WithShutdown returns ctx carrying shuttingDown, which the server that
// serves the requests of ctx closes when it begins to shut down.
func WithShutdown(ctx context.Context, shuttingDown <-chan struct{}) context.Context {
	return context.WithValue(ctx, shutdownKey{}, shuttingDown)
}

// errShuttingDown is why a watch ended when its server shut down: the
// caller watches again, on this server once it is back or on another
// replica. Each watch answers a Connect error of its own (unavailable):
// interceptors complete an error in place, so one is never shared.
var errShuttingDown = errors.New("the server is shutting down; watch again")

// untilShutdown returns ctx, ended also when its server begins to shut
// down, and the function that ends it. A watch, which runs until its
// caller leaves, runs under it: the server's shutdown would otherwise wait
// its whole grace period for it. shutDown turns the error the watch ended
// with into unavailable, errShuttingDown, when the shutdown ended it.
func untilShutdown(ctx context.Context) (watchCtx context.Context, shutDown func(error) error, cancel context.CancelFunc) {
	ch, _ := ctx.Value(shutdownKey{}).(<-chan struct{})
	watchCtx, cancelCause := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-ch: // nil outside a server: never
			cancelCause(errShuttingDown)
		case <-watchCtx.Done():
		}
	}()
	shutDown = func(err error) error {
		if errors.Is(context.Cause(watchCtx), errShuttingDown) {
			return connect.NewError(connect.CodeUnavailable, errShuttingDown)
		}
		return err
	}
	return watchCtx, shutDown, func() { cancelCause(nil) }
}
