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
	objects *upstreams.Egresses
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
	m := req.Msg
	return Respond(upstreams.Create(ctx, s.objects, Mutation[*ctrlv1.CreateEgressResponse](req, m.GetCommand()),
		m.GetSpec(), m.GetLabels(), m.GetAnnotations(),
		func(o upstreams.Object[*ctrlv1.EgressSpec]) *ctrlv1.CreateEgressResponse {
			return &ctrlv1.CreateEgressResponse{Egress: toEgress(o)}
		}))
}

func (s *EgressService) GetEgress(ctx context.Context, req *connect.Request[ctrlv1.GetEgressRequest]) (*connect.Response[ctrlv1.GetEgressResponse], error) {
	o, err := s.objects.Get(ctx, req.Msg.GetEgressId())
	return Respond(&ctrlv1.GetEgressResponse{Egress: toEgress(o)}, err)
}

func (s *EgressService) ListEgresses(ctx context.Context, req *connect.Request[ctrlv1.ListEgressesRequest]) (*connect.Response[ctrlv1.ListEgressesResponse], error) {
	m := req.Msg
	page, err := s.objects.List(ctx, m.GetPageSize(), m.GetPageToken(), m.GetLabelSelector())
	resp := &ctrlv1.ListEgressesResponse{NextPageToken: page.Next}
	for _, o := range page.Objects {
		resp.Egresses = append(resp.Egresses, toEgress(o))
	}
	return Respond(resp, err)
}

func (s *EgressService) UpdateEgress(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressRequest]) (*connect.Response[ctrlv1.UpdateEgressResponse], error) {
	m := req.Msg
	return Respond(upstreams.Update(ctx, s.objects, Mutation[*ctrlv1.UpdateEgressResponse](req, m.GetCommand()),
		m.GetEgressId(), m.GetExpectedRevision(), m.GetSpec(), m.DrainSeconds,
		func(o upstreams.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressResponse {
			return &ctrlv1.UpdateEgressResponse{Egress: toEgress(o)}
		}))
}

func (s *EgressService) DeleteEgress(ctx context.Context, req *connect.Request[ctrlv1.DeleteEgressRequest]) (*connect.Response[ctrlv1.DeleteEgressResponse], error) {
	m := req.Msg
	return Respond(upstreams.Delete(ctx, s.objects, Mutation[*ctrlv1.DeleteEgressResponse](req, m.GetCommand()),
		m.GetEgressId(), func() *ctrlv1.DeleteEgressResponse { return &ctrlv1.DeleteEgressResponse{} }))
}

func (s *EgressService) UpdateEgressLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressLabelsRequest]) (*connect.Response[ctrlv1.UpdateEgressLabelsResponse], error) {
	m := req.Msg
	return Respond(upstreams.UpdateMap(ctx, s.objects, Mutation[*ctrlv1.UpdateEgressLabelsResponse](req, m.GetCommand()),
		resource.Labels, m.GetEgressId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(o upstreams.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressLabelsResponse {
			return &ctrlv1.UpdateEgressLabelsResponse{Egress: toEgress(o)}
		}))
}

func (s *EgressService) UpdateEgressAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateEgressAnnotationsResponse], error) {
	m := req.Msg
	return Respond(upstreams.UpdateMap(ctx, s.objects, Mutation[*ctrlv1.UpdateEgressAnnotationsResponse](req, m.GetCommand()),
		resource.Annotations, m.GetEgressId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(o upstreams.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressAnnotationsResponse {
			return &ctrlv1.UpdateEgressAnnotationsResponse{Egress: toEgress(o)}
		}))
}
