package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/sessions"
)

// SessionService serves kibotos.ctrl.v1.SessionService over a Service.
type SessionService struct {
	ctrlv1connect.UnimplementedSessionServiceHandler
	svc *sessions.Service
}

var _ ctrlv1connect.SessionServiceHandler = (*SessionService)(nil)

// NewSessionService returns the SessionService handler. Mount it behind the auth
// interceptor, which puts the caller in the context.
func NewSessionService(svc *sessions.Service) *SessionService { return &SessionService{svc: svc} }

func (h *SessionService) IssueSession(ctx context.Context, req *connect.Request[ctrlv1.IssueSessionRequest]) (*connect.Response[ctrlv1.IssueSessionResponse], error) {
	return Respond(h.svc.Issue(ctx, req.Msg.GetWorkspaceId(), req.Msg.GetTtlSeconds()))
}

func (h *SessionService) RevokeSession(ctx context.Context, req *connect.Request[ctrlv1.RevokeSessionRequest]) (*connect.Response[ctrlv1.RevokeSessionResponse], error) {
	return Respond(h.svc.Revoke(ctx, Mutation[*ctrlv1.RevokeSessionResponse](req, req.Msg.GetCommand()),
		req.Msg.GetSessionId()))
}

func (h *SessionService) RotateDataPlane(ctx context.Context, req *connect.Request[ctrlv1.RotateDataPlaneRequest]) (*connect.Response[ctrlv1.RotateDataPlaneResponse], error) {
	return Respond(h.svc.Rotate(ctx, Mutation[*ctrlv1.RotateDataPlaneResponse](req, req.Msg.GetCommand()),
		req.Msg.GetWorkspaceId()))
}
