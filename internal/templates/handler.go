package templates

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
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
	return respond(h.svc.CreateTemplate(ctx, req.Msg))
}

func (h *Handler) GetTemplate(ctx context.Context, req *connect.Request[ctrlv1.GetTemplateRequest]) (*connect.Response[ctrlv1.GetTemplateResponse], error) {
	return respond(h.svc.GetTemplate(ctx, req.Msg))
}

func (h *Handler) ListTemplates(ctx context.Context, req *connect.Request[ctrlv1.ListTemplatesRequest]) (*connect.Response[ctrlv1.ListTemplatesResponse], error) {
	return respond(h.svc.ListTemplates(ctx, req.Msg))
}

func (h *Handler) ImportTemplateRevision(ctx context.Context, stream *connect.ClientStream[ctrlv1.ImportTemplateRevisionRequest]) (*connect.Response[ctrlv1.ImportTemplateRevisionResponse], error) {
	return respond(h.svc.ImportTemplateRevision(ctx, func() (*ctrlv1.ImportTemplateRevisionRequest, error) {
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
	return respond(h.svc.SetTemplateDefault(ctx, req.Msg))
}

func (h *Handler) DeleteTemplate(ctx context.Context, req *connect.Request[ctrlv1.DeleteTemplateRequest]) (*connect.Response[ctrlv1.DeleteTemplateResponse], error) {
	return respond(h.svc.DeleteTemplate(ctx, req.Msg))
}

func (h *Handler) UpdateTemplateLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateTemplateLabelsRequest]) (*connect.Response[ctrlv1.UpdateTemplateLabelsResponse], error) {
	return respond(h.svc.UpdateTemplateLabels(ctx, req.Msg))
}

func (h *Handler) UpdateTemplateAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateTemplateAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateTemplateAnnotationsResponse], error) {
	return respond(h.svc.UpdateTemplateAnnotations(ctx, req.Msg))
}

// respond wraps a result, passing canonical errors through and reporting
// any other error as internal without its text (which may name database
// or file system details).
func respond[R any](msg *R, err error) (*connect.Response[R], error) {
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		slog.Error("internal error", "service", "TemplateService", "err", err)
		return nil, connect.NewError(connect.CodeInternal, errors.New("internal error; see the server log"))
	}
	return connect.NewResponse(msg), nil
}
