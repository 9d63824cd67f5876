// Package callertest stands in for the auth interceptor in tests that
// serve one ctrl service's handler: a client made with Client calls for a
// project it names in a header, and the handler made with Handler takes
// its caller, an editor of that project, from the header.
package callertest

import (
	"context"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrl/auth"
)

// header names the project a test call acts for.
const header = "Test-Project"

// Handler is the handler option that makes each call's caller an editor
// of the project its client names.
func Handler() connect.HandlerOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			ctx = auth.WithCaller(ctx, auth.Caller{ProjectID: req.Header().Get(header), Role: auth.Editor})
			return next(ctx, req)
		}
	}))
}

// Client is the client option that calls for project.
func Client(project string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(header, project)
			return next(ctx, req)
		}
	}))
}
