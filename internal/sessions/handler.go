package sessions

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/rpc"
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
	return rpc.Respond(h.svc.Issue(ctx, req.Msg.GetWorkspaceId(), req.Msg.GetTtlSeconds()))
}

func (h *Handler) RevokeSession(ctx context.Context, req *connect.Request[ctrlv1.RevokeSessionRequest]) (*connect.Response[ctrlv1.RevokeSessionResponse], error) {
	return rpc.Respond(h.svc.Revoke(ctx, rpc.Mutation[*ctrlv1.RevokeSessionResponse](req, req.Msg.GetCommand()),
		req.Msg.GetSessionId()))
}

func (h *Handler) RotateDataPlane(ctx context.Context, req *connect.Request[ctrlv1.RotateDataPlaneRequest]) (*connect.Response[ctrlv1.RotateDataPlaneResponse], error) {
	return rpc.Respond(h.svc.Rotate(ctx, rpc.Mutation[*ctrlv1.RotateDataPlaneResponse](req, req.Msg.GetCommand()),
		req.Msg.GetWorkspaceId()))
}
