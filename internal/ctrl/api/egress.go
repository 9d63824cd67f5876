package api

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/upstreams"
)

// EgressService serves kibotos.ctrl.v1.EgressService.
type EgressService struct {
	ctrlv1connect.UnimplementedEgressServiceHandler
	kind upstreamKind[*ctrlv1.EgressSpec, *ctrlv1.Egress]
}

func toEgress(o upstreams.Object[*ctrlv1.EgressSpec]) *ctrlv1.Egress {
	return &ctrlv1.Egress{
		EgressId: o.ID, Spec: o.Spec, Revision: o.Revision,
		CreatedAt: timestamppb.New(o.CreatedAt), UpdatedAt: timestamppb.New(o.UpdatedAt),
		Labels: o.Labels, Annotations: o.Annotations,
		LabelsRevision: o.LabelsRevision, AnnotationsRevision: o.AnnotationsRevision,
	}
}

func (s *EgressService) CreateEgress(ctx context.Context, req *connect.Request[ctrlv1.CreateEgressRequest]) (*connect.Response[ctrlv1.CreateEgressResponse], error) {
	return createUpstream(ctx, s.kind, req,
		func(e *ctrlv1.Egress) *ctrlv1.CreateEgressResponse { return &ctrlv1.CreateEgressResponse{Egress: e} })
}

func (s *EgressService) GetEgress(ctx context.Context, req *connect.Request[ctrlv1.GetEgressRequest]) (*connect.Response[ctrlv1.GetEgressResponse], error) {
	return getUpstream(ctx, s.kind, req.Msg.GetEgressId(),
		func(e *ctrlv1.Egress) *ctrlv1.GetEgressResponse { return &ctrlv1.GetEgressResponse{Egress: e} })
}

func (s *EgressService) ListEgresses(ctx context.Context, req *connect.Request[ctrlv1.ListEgressesRequest]) (*connect.Response[ctrlv1.ListEgressesResponse], error) {
	return listUpstreams(ctx, s.kind, req.Msg, func(egresses []*ctrlv1.Egress, next string) *ctrlv1.ListEgressesResponse {
		return &ctrlv1.ListEgressesResponse{Egresses: egresses, NextPageToken: next}
	})
}

func (s *EgressService) UpdateEgress(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressRequest]) (*connect.Response[ctrlv1.UpdateEgressResponse], error) {
	return updateUpstream(ctx, s.kind, req, req.Msg.GetEgressId(), req.Msg.DrainSeconds,
		func(e *ctrlv1.Egress) *ctrlv1.UpdateEgressResponse { return &ctrlv1.UpdateEgressResponse{Egress: e} })
}

func (s *EgressService) DeleteEgress(ctx context.Context, req *connect.Request[ctrlv1.DeleteEgressRequest]) (*connect.Response[ctrlv1.DeleteEgressResponse], error) {
	return deleteUpstream(ctx, s.kind, req, req.Msg.GetEgressId(),
		func() *ctrlv1.DeleteEgressResponse { return &ctrlv1.DeleteEgressResponse{} })
}

func (s *EgressService) UpdateEgressLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressLabelsRequest]) (*connect.Response[ctrlv1.UpdateEgressLabelsResponse], error) {
	m := req.Msg
	return updateUpstreamMap(ctx, s.kind, req, resource.Labels, m.GetEgressId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(e *ctrlv1.Egress) *ctrlv1.UpdateEgressLabelsResponse {
			return &ctrlv1.UpdateEgressLabelsResponse{Egress: e}
		})
}

func (s *EgressService) UpdateEgressAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateEgressAnnotationsResponse], error) {
	m := req.Msg
	return updateUpstreamMap(ctx, s.kind, req, resource.Annotations, m.GetEgressId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(e *ctrlv1.Egress) *ctrlv1.UpdateEgressAnnotationsResponse {
			return &ctrlv1.UpdateEgressAnnotationsResponse{Egress: e}
		})
}
