// Package bearer is the Bearer scheme of API authentication: a Connect
// interceptor that sends "Authorization: Bearer <token>" on every call,
// unary or streaming, which the CLI, the host agent and tests share, and
// Parse, with which the servers read it.
package bearer

import (
	"context"

	"connectrpc.com/connect"
)

// Token is a bearer token; as a connect.Interceptor it sends itself.
type Token string

// WrapUnary implements connect.Interceptor.
func (t Token) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			req.Header().Set("Authorization", "Bearer "+string(t))
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (t Token) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(t))
		return conn
	}
}

// WrapStreamingHandler implements connect.Interceptor; servers are not
// its business.
func (Token) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
