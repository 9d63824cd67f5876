// Package accesslog gives every HTTP request to the control plane a
// request id, returned in the X-Request-Id response header, and writes one
// log line per Connect call: procedure, code, latency, project and request
// id. An internal error is logged with its cause and the request id, and
// the caller gets only "internal error; see the server log" with the id,
// so that an operator finds the cause from what the caller reports.
// Every call's error passes through it, so it also gives the errors all
// calls share their one answer: a database that does not answer or has no
// disk left, and a call its caller abandoned.
//
// Wiring: Middleware wraps the whole handler; Interceptor comes first among
// a handler's interceptors and its Project interceptor after the one that
// authenticates the caller.
package accesslog

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Header is the response header that carries the request id.
const Header = "X-Request-Id"

// internalMessage is what a caller learns of an internal error.
const internalMessage = "internal error; see the server log"

var (
	// errStoreFull says why a change the control plane's database had no
	// disk space to store is resource_exhausted.
	errStoreFull = errors.New("the control plane's database has no disk space left: nothing can change until an operator frees space on its disk")
	// errStoreUnavailable says why a call the control plane's database did
	// not answer is unavailable, without the database's details (its
	// user, name and address).
	errStoreUnavailable = errors.New("the control plane's database does not answer; retry shortly")
)

// call is what the log line of one request gathers.
type call struct {
	id      string
	project string
}

type callKey struct{}

// Middleware gives each request a new request id: in its context (see
// RequestID) and in the X-Request-Id header of its response.
func Middleware(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &call{id: newID()}
		w.Header().Set(Header, c.id)
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
	})
}

// idEncoding is lower-case base32.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567")

// newID returns 16 random characters of lower-case base32.
func newID() string {
	var b [10]byte
	rand.Read(b[:])
	return idEncoding.EncodeToString(b[:])
}

// RequestID returns the request id of ctx, or "" outside Middleware.
func RequestID(ctx context.Context) string {
	if c, ok := ctx.Value(callKey{}).(*call); ok {
		return c.id
	}
	return ""
}

// internalError is an error whose cause the caller does not see.
type internalError struct{ cause error }

func (e *internalError) Error() string { return internalMessage }
func (e *internalError) Unwrap() error { return e.cause }

// Internal returns the internal error of cause: its message is "internal
// error; see the server log", and the Interceptor logs cause with the
// request id and adds the id to the message.
func Internal(cause error) *connect.Error {
	return connect.NewError(connect.CodeInternal, &internalError{cause: cause})
}

// Interceptor logs each call once it ends, at level (host agents' calls
// are frequent: the server logs them at debug).
type Interceptor struct {
	Logger *slog.Logger // nil is slog.Default()
	Level  slog.Level
}

func (i *Interceptor) logger() *slog.Logger {
	if i.Logger != nil {
		return i.Logger
	}
	return slog.Default()
}

// WrapUnary implements connect.Interceptor.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		resp, err := next(ctx, req)
		return resp, i.end(ctx, req.Spec().Procedure, start, err)
	}
}

// WrapStreamingClient implements connect.Interceptor; clients are not
// logged.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor.
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		return i.end(ctx, conn.Spec().Procedure, start, next(ctx, conn))
	}
}

// Refused logs a call of procedure refused with err before it reached the
// interceptors (auth.Gate), as they log the calls they see, and returns
// the error to answer it with, as they would.
func (i *Interceptor) Refused(ctx context.Context, procedure string, start time.Time, err error) error {
	return i.end(ctx, procedure, start, err)
}

// end logs the call and returns its error, an internal one with the
// request id.
func (i *Interceptor) end(ctx context.Context, procedure string, start time.Time, err error) error {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil {
		c = &call{}
	}
	err = shared(ctx, err)
	code := "ok"
	if err != nil {
		code = connect.CodeOf(err).String()
	}
	var ie *internalError
	if errors.As(err, &ie) {
		i.logger().ErrorContext(ctx, "internal error", "method", procedure, "request_id", c.id, "err", ie.cause)
		err = connect.NewError(connect.CodeInternal, fmt.Errorf("%s (request id %s)", internalMessage, c.id))
	}
	i.logger().Log(ctx, i.Level, "call", "method", procedure, "code", code,
		"latency", time.Since(start), "project", c.project, "request_id", c.id)
	return err
}

// shared returns the answer every call gives err when err is one that
// any call may meet, whichever layer saw it first (the token's check, a
// handler, a stream); any other error as it is.
func shared(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrUnavailable):
		return connect.NewError(connect.CodeUnavailable, errStoreUnavailable)
	case errors.Is(err, store.ErrFull):
		return connect.NewError(connect.CodeResourceExhausted, errStoreFull)
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		// The caller went away (or its deadline passed) while the call
		// waited: not the server's fault, whatever layer noticed it.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	return err
}

// Project returns the interceptor that notes the authenticated caller's
// project for the log line; it goes after the one that authenticates.
func Project() connect.Interceptor { return projectInterceptor{} }

type projectInterceptor struct{}

func note(ctx context.Context) {
	if c, ok := ctx.Value(callKey{}).(*call); ok {
		if caller, ok := auth.CallerFrom(ctx); ok {
			c.project = caller.ProjectID
		}
	}
}

func (projectInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		note(ctx)
		return next(ctx, req)
	}
}

func (projectInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (projectInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		note(ctx)
		return next(ctx, conn)
	}
}
