package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// Interceptor authenticates every call and enforces the role a method
// needs: methods named Get*, List*, Watch* or Read* read, every other method
// writes, and reading a workspace's files (its transfer artifact) needs an
// editor, as a data-plane session does. Finer checks (admin-only methods,
// tenancy) are the handlers'.
type Interceptor struct {
	Tokens *Cache
}

var _ connect.Interceptor = (*Interceptor)(nil)

// WrapUnary implements connect.Interceptor.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := i.authorize(ctx, req.Spec().Procedure, req.Header().Get("Authorization"))
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// streamRecheck is how often the token of an open stream is authenticated
// again, so that a stream (a watch) ends once its token is revoked: within
// streamRecheck on the ctrl that revoked it, and within the cache's TTL
// more on the others.
const streamRecheck = time.Second

// WrapStreamingHandler implements connect.Interceptor. A stream whose
// token no longer authenticates ends unauthenticated (WhileAuthenticated).
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		header := conn.RequestHeader().Get("Authorization")
		ctx, err := i.authorize(ctx, conn.Spec().Procedure, header)
		if err != nil {
			return err
		}
		token, _ := bearer.Parse(header)
		return WhileAuthenticated(ctx, streamRecheck, func(ctx context.Context) error {
			if _, err := i.Tokens.Authenticate(ctx, token); errors.Is(err, ErrUnauthenticated) {
				return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("the token no longer authenticates (revoked while the stream was open): %w", err))
			}
			return nil
		}, func(ctx context.Context) error { return next(ctx, conn) })
	}
}

// Check authenticates the API token of an Authorization header and checks
// that its role may call procedure: the Gate's key of its project, or the
// refusal the call gets.
func (i *Interceptor) Check(ctx context.Context, procedure, header string) (string, error) {
	c, err := i.authenticate(ctx, header)
	if err == nil {
		err = allowed(c, procedure)
	}
	return c.ProjectID, err
}

// authenticate returns the caller an Authorization header names.
func (i *Interceptor) authenticate(ctx context.Context, header string) (Caller, error) {
	token, ok := bearer.Parse(header)
	if !ok {
		return Caller{}, connect.NewError(connect.CodeUnauthenticated, errors.New("an API token is required: send Authorization: Bearer <token>"))
	}
	c, err := i.Tokens.Authenticate(ctx, token)
	if errors.Is(err, ErrUnauthenticated) {
		return Caller{}, connect.NewError(connect.CodeUnauthenticated, err)
	}
	if err != nil {
		return Caller{}, connect.NewError(connect.CodeUnavailable, err)
	}
	return c, nil
}

func (i *Interceptor) authorize(ctx context.Context, procedure, header string) (context.Context, error) {
	c, err := i.authenticate(ctx, header)
	if err != nil {
		return nil, err
	}
	if err := allowed(c, procedure); err != nil {
		return nil, err
	}
	return WithCaller(ctx, c), nil
}

// allowed refuses a call to procedure that c's role may not make.
func allowed(c Caller, procedure string) error {
	if need := RoleFor(procedure); !c.Role.Allows(need) {
		return connect.NewError(connect.CodePermissionDenied,
			errors.New("this token's role "+string(c.Role)+" may not call "+procedure+"; it needs "+string(need)))
	}
	return nil
}

// RoleFor returns the least role a procedure (/pkg.Service/Method) needs:
// an admin for AdminService's calls but the two every token may make, a
// viewer for reads but of a workspace's files, an editor for the rest.
func RoleFor(procedure string) Role {
	method := procedure[strings.LastIndexByte(procedure, '/')+1:]
	if strings.HasPrefix(procedure, "/"+adminv1connect.AdminServiceName+"/") {
		if method == "GetCaller" || method == "ListProjects" {
			return Viewer
		}
		return Admin
	}
	if procedure == ctrlv1connect.TransferServiceReadTransferArtifactProcedure {
		return Editor // the artifact holds the workspace's files
	}
	for _, read := range []string{"Get", "List", "Watch", "Read"} {
		if strings.HasPrefix(method, read) {
			return Viewer
		}
	}
	return Editor
}
