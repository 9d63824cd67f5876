package api

import (
	"context"
	"io"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
)

// TemplateService serves kibotos.ctrl.v1.TemplateService over Connect.
type TemplateService struct {
	ctrlv1connect.UnimplementedTemplateServiceHandler
	svc *templates.Service
}

var _ ctrlv1connect.TemplateServiceHandler = (*TemplateService)(nil)

// NewTemplateService returns the TemplateService handler of svc.
func NewTemplateService(svc *templates.Service) *TemplateService { return &TemplateService{svc: svc} }

func (h *TemplateService) CreateTemplate(ctx context.Context, req *connect.Request[ctrlv1.CreateTemplateRequest]) (*connect.Response[ctrlv1.CreateTemplateResponse], error) {
	return Respond(h.svc.CreateTemplate(ctx, req.Msg))
}

func (h *TemplateService) GetTemplate(ctx context.Context, req *connect.Request[ctrlv1.GetTemplateRequest]) (*connect.Response[ctrlv1.GetTemplateResponse], error) {
	return Respond(h.svc.GetTemplate(ctx, req.Msg))
}

func (h *TemplateService) ListTemplates(ctx context.Context, req *connect.Request[ctrlv1.ListTemplatesRequest]) (*connect.Response[ctrlv1.ListTemplatesResponse], error) {
	return Respond(h.svc.ListTemplates(ctx, req.Msg))
}

func (h *TemplateService) ImportTemplateRevision(ctx context.Context, stream *connect.ClientStream[ctrlv1.ImportTemplateRevisionRequest]) (*connect.Response[ctrlv1.ImportTemplateRevisionResponse], error) {
	return Respond(h.svc.ImportTemplateRevision(ctx, func() (*ctrlv1.ImportTemplateRevisionRequest, error) {
		if stream.Receive() {
			return stream.Msg(), nil
		}
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}))
}

func (h *TemplateService) SetTemplateDefault(ctx context.Context, req *connect.Request[ctrlv1.SetTemplateDefaultRequest]) (*connect.Response[ctrlv1.SetTemplateDefaultResponse], error) {
	return Respond(h.svc.SetTemplateDefault(ctx, req.Msg))
}

func (h *TemplateService) DeleteTemplate(ctx context.Context, req *connect.Request[ctrlv1.DeleteTemplateRequest]) (*connect.Response[ctrlv1.DeleteTemplateResponse], error) {
	return Respond(h.svc.DeleteTemplate(ctx, req.Msg))
}

func (h *TemplateService) UpdateTemplateLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateTemplateLabelsRequest]) (*connect.Response[ctrlv1.UpdateTemplateLabelsResponse], error) {
	return Respond(h.svc.UpdateTemplateLabels(ctx, req.Msg))
}

func (h *TemplateService) UpdateTemplateAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateTemplateAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateTemplateAnnotationsResponse], error) {
	return Respond(h.svc.UpdateTemplateAnnotations(ctx, req.Msg))
}
