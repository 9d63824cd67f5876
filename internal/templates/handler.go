package templates

import (
	"context"
	"io"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/rpc"
)

// Handler serves kibotos.ctrl.v1.TemplateService over Connect.
type Handler struct {
	ctrlv1connect.UnimplementedTemplateServiceHandler
	svc *Service
}

var _ ctrlv1connect.TemplateServiceHandler = (*Handler)(nil)

// NewHandler returns the TemplateService handler of svc.
func NewHandler(svc *Service) *Handler { return &Handler{svc: svc} }

func (h *Handler) CreateTemplate(ctx context.Context, req *connect.Request[ctrlv1.CreateTemplateRequest]) (*connect.Response[ctrlv1.CreateTemplateResponse], error) {
	return rpc.Respond(h.svc.CreateTemplate(ctx, req.Msg))
}

func (h *Handler) GetTemplate(ctx context.Context, req *connect.Request[ctrlv1.GetTemplateRequest]) (*connect.Response[ctrlv1.GetTemplateResponse], error) {
	return rpc.Respond(h.svc.GetTemplate(ctx, req.Msg))
}

func (h *Handler) ListTemplates(ctx context.Context, req *connect.Request[ctrlv1.ListTemplatesRequest]) (*connect.Response[ctrlv1.ListTemplatesResponse], error) {
	return rpc.Respond(h.svc.ListTemplates(ctx, req.Msg))
}

func (h *Handler) ImportTemplateRevision(ctx context.Context, stream *connect.ClientStream[ctrlv1.ImportTemplateRevisionRequest]) (*connect.Response[ctrlv1.ImportTemplateRevisionResponse], error) {
	return rpc.Respond(h.svc.ImportTemplateRevision(ctx, func() (*ctrlv1.ImportTemplateRevisionRequest, error) {
		if stream.Receive() {
			return stream.Msg(), nil
		}
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}))
}

func (h *Handler) SetTemplateDefault(ctx context.Context, req *connect.Request[ctrlv1.SetTemplateDefaultRequest]) (*connect.Response[ctrlv1.SetTemplateDefaultResponse], error) {
	return rpc.Respond(h.svc.SetTemplateDefault(ctx, req.Msg))
}

func (h *Handler) DeleteTemplate(ctx context.Context, req *connect.Request[ctrlv1.DeleteTemplateRequest]) (*connect.Response[ctrlv1.DeleteTemplateResponse], error) {
	return rpc.Respond(h.svc.DeleteTemplate(ctx, req.Msg))
}

func (h *Handler) UpdateTemplateLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateTemplateLabelsRequest]) (*connect.Response[ctrlv1.UpdateTemplateLabelsResponse], error) {
	return rpc.Respond(h.svc.UpdateTemplateLabels(ctx, req.Msg))
}

func (h *Handler) UpdateTemplateAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateTemplateAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateTemplateAnnotationsResponse], error) {
	return rpc.Respond(h.svc.UpdateTemplateAnnotations(ctx, req.Msg))
}
