package sessions

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/workspaces"
)

// Handler serves kibotos.ctrl.v1.SessionService over a Service.
type Handler struct {
	ctrlv1connect.UnimplementedSessionServiceHandler
	svc *Service
}

var _ ctrlv1connect.SessionServiceHandler = (*Handler)(nil)

// NewHandler returns the SessionService handler. Mount it behind the auth
// interceptor, which puts the caller in the context.
func NewHandler(svc *Service) *Handler { return &Handler{svc: svc} }

func (h *Handler) IssueSession(ctx context.Context, req *connect.Request[ctrlv1.IssueSessionRequest]) (*connect.Response[ctrlv1.IssueSessionResponse], error) {
	return respond(h.svc.Issue(ctx, req.Msg.GetWorkspaceId(), req.Msg.GetTtlSeconds()))
}

func (h *Handler) RevokeSession(ctx context.Context, req *connect.Request[ctrlv1.RevokeSessionRequest]) (*connect.Response[ctrlv1.RevokeSessionResponse], error) {
	return respond(h.svc.Revoke(ctx, write[*ctrlv1.RevokeSessionResponse](req.Spec().Procedure, req.Msg.GetCommand(), req.Msg),
		req.Msg.GetSessionId()))
}

func (h *Handler) RotateDataPlane(ctx context.Context, req *connect.Request[ctrlv1.RotateDataPlaneRequest]) (*connect.Response[ctrlv1.RotateDataPlaneResponse], error) {
	return respond(h.svc.Rotate(ctx, write[*ctrlv1.RotateDataPlaneResponse](req.Spec().Procedure, req.Msg.GetCommand(), req.Msg),
		req.Msg.GetWorkspaceId()))
}

// write describes a write request: the whole request is the command's
// input.
func write[R proto.Message](method string, cmd *ctrlv1.CommandMetadata, input proto.Message) workspaces.Write[R] {
	return workspaces.Write[R]{Method: method, Command: cmd, Input: input,
		New: func() R { var zero R; return zero.ProtoReflect().Type().New().Interface().(R) }}
}

// respond wraps a result, passing canonical errors through and reporting
// any other error as internal without its text.
func respond[R any](msg *R, err error) (*connect.Response[R], error) {
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		slog.Error("internal error", "err", err)
		return nil, connect.NewError(connect.CodeInternal, errors.New("internal error; see the server log"))
	}
	return connect.NewResponse(msg), nil
}
