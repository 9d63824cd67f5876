package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
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
	m := req.Msg
	return Respond(h.svc.CreateTemplate(ctx, Mutation[*ctrlv1.CreateTemplateResponse](req, m.GetCommand()),
		m.GetTemplateId(), m.GetLabels(), m.GetAnnotations()))
}

func (h *TemplateService) GetTemplate(ctx context.Context, req *connect.Request[ctrlv1.GetTemplateRequest]) (*connect.Response[ctrlv1.GetTemplateResponse], error) {
	t, err := h.svc.GetTemplate(ctx, req.Msg.GetTemplateId())
	return Respond(&ctrlv1.GetTemplateResponse{Template: t}, err)
}

func (h *TemplateService) ListTemplates(ctx context.Context, req *connect.Request[ctrlv1.ListTemplatesRequest]) (*connect.Response[ctrlv1.ListTemplatesResponse], error) {
	m := req.Msg
	list, next, err := h.svc.ListTemplates(ctx, m.GetPageSize(), m.GetPageToken(), m.GetLabelSelector())
	return Respond(&ctrlv1.ListTemplatesResponse{Templates: list, NextPageToken: next}, err)
}

func (h *TemplateService) ImportTemplateRevision(ctx context.Context, stream *connect.ClientStream[ctrlv1.ImportTemplateRevisionRequest]) (*connect.Response[ctrlv1.ImportTemplateRevisionResponse], error) {
	return Respond(h.svc.ImportTemplateRevision(ctx, receiver(stream)))
}

func (h *TemplateService) SetTemplateDefault(ctx context.Context, req *connect.Request[ctrlv1.SetTemplateDefaultRequest]) (*connect.Response[ctrlv1.SetTemplateDefaultResponse], error) {
	m := req.Msg
	return Respond(h.svc.SetTemplateDefault(ctx, Mutation[*ctrlv1.SetTemplateDefaultResponse](req, m.GetCommand()),
		m.GetTemplateId(), m.GetExpectedRevision(), m.GetDefaultRevision()))
}

func (h *TemplateService) DeleteTemplate(ctx context.Context, req *connect.Request[ctrlv1.DeleteTemplateRequest]) (*connect.Response[ctrlv1.DeleteTemplateResponse], error) {
	return Respond(h.svc.DeleteTemplate(ctx, Mutation[*ctrlv1.DeleteTemplateResponse](req, req.Msg.GetCommand()), req.Msg.GetTemplateId()))
}

func (h *TemplateService) UpdateTemplateLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateTemplateLabelsRequest]) (*connect.Response[ctrlv1.UpdateTemplateLabelsResponse], error) {
	m := req.Msg
	return Respond(templates.UpdateMap(ctx, h.svc, Mutation[*ctrlv1.UpdateTemplateLabelsResponse](req, m.GetCommand()),
		resource.Labels, m.GetTemplateId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(t *ctrlv1.Template) *ctrlv1.UpdateTemplateLabelsResponse {
			return &ctrlv1.UpdateTemplateLabelsResponse{Template: t}
		}))
}

func (h *TemplateService) UpdateTemplateAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateTemplateAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateTemplateAnnotationsResponse], error) {
	m := req.Msg
	return Respond(templates.UpdateMap(ctx, h.svc, Mutation[*ctrlv1.UpdateTemplateAnnotationsResponse](req, m.GetCommand()),
		resource.Annotations, m.GetTemplateId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(t *ctrlv1.Template) *ctrlv1.UpdateTemplateAnnotationsResponse {
			return &ctrlv1.UpdateTemplateAnnotationsResponse{Template: t}
		}))
}
