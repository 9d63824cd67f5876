package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/exposures"
)

// ExposureService serves kibotos.ctrl.v1.ExposureService over a Service.
type ExposureService struct {
	ctrlv1connect.UnimplementedExposureServiceHandler
	svc *exposures.Service
}

var _ ctrlv1connect.ExposureServiceHandler = (*ExposureService)(nil)

// NewExposureService returns the ExposureService handler. Mount it behind
// the auth interceptor, which puts the caller in the context.
func NewExposureService(svc *exposures.Service) *ExposureService { return &ExposureService{svc: svc} }

func (h *ExposureService) CreateExposure(ctx context.Context, req *connect.Request[ctrlv1.CreateExposureRequest]) (*connect.Response[ctrlv1.CreateExposureResponse], error) {
	m := req.Msg
	return Respond(h.svc.Create(ctx, Mutation[*ctrlv1.CreateExposureResponse](req, m.GetCommand()),
		m.GetWorkspaceId(), m.GetPort(), m.GetAuth(), m.GetPersistent()))
}

func (h *ExposureService) RevokeExposure(ctx context.Context, req *connect.Request[ctrlv1.RevokeExposureRequest]) (*connect.Response[ctrlv1.RevokeExposureResponse], error) {
	return Respond(h.svc.Revoke(ctx, Mutation[*ctrlv1.RevokeExposureResponse](req, req.Msg.GetCommand()), req.Msg.GetExposureId()))
}

func (h *ExposureService) ListExposures(ctx context.Context, req *connect.Request[ctrlv1.ListExposuresRequest]) (*connect.Response[ctrlv1.ListExposuresResponse], error) {
	m := req.Msg
	list, next, err := h.svc.List(ctx, m.GetWorkspaceId(), m.GetPageSize(), m.GetPageToken())
	return Respond(&ctrlv1.ListExposuresResponse{Exposures: list, NextPageToken: next}, err)
}
