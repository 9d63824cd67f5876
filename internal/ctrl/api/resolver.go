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

// ResolverService serves kibotos.ctrl.v1.ResolverService.
type ResolverService struct {
	ctrlv1connect.UnimplementedResolverServiceHandler
	objects *upstreams.Resolvers
}

func toResolver(o upstreams.Object[*ctrlv1.ResolverSpec]) *ctrlv1.Resolver {
	return &ctrlv1.Resolver{
		ResolverId: o.ID, Spec: o.Spec, Revision: o.Revision,
		CreatedAt: timestamppb.New(o.CreatedAt), UpdatedAt: timestamppb.New(o.UpdatedAt),
		Labels: o.Labels, Annotations: o.Annotations,
		LabelsRevision: o.LabelsRevision, AnnotationsRevision: o.AnnotationsRevision,
	}
}

func (s *ResolverService) CreateResolver(ctx context.Context, req *connect.Request[ctrlv1.CreateResolverRequest]) (*connect.Response[ctrlv1.CreateResolverResponse], error) {
	m := req.Msg
	return Respond(upstreams.Create(ctx, s.objects, Mutation[*ctrlv1.CreateResolverResponse](req, m.GetCommand()),
		m.GetSpec(), m.GetLabels(), m.GetAnnotations(),
		func(o upstreams.Object[*ctrlv1.ResolverSpec]) *ctrlv1.CreateResolverResponse {
			return &ctrlv1.CreateResolverResponse{Resolver: toResolver(o)}
		}))
}

func (s *ResolverService) GetResolver(ctx context.Context, req *connect.Request[ctrlv1.GetResolverRequest]) (*connect.Response[ctrlv1.GetResolverResponse], error) {
	o, err := s.objects.Get(ctx, req.Msg.GetResolverId())
	return Respond(&ctrlv1.GetResolverResponse{Resolver: toResolver(o)}, err)
}

func (s *ResolverService) ListResolvers(ctx context.Context, req *connect.Request[ctrlv1.ListResolversRequest]) (*connect.Response[ctrlv1.ListResolversResponse], error) {
	m := req.Msg
	page, err := s.objects.List(ctx, m.GetPageSize(), m.GetPageToken(), m.GetLabelSelector())
	resp := &ctrlv1.ListResolversResponse{NextPageToken: page.Next}
	for _, o := range page.Objects {
		resp.Resolvers = append(resp.Resolvers, toResolver(o))
	}
	return Respond(resp, err)
}

func (s *ResolverService) UpdateResolver(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverRequest]) (*connect.Response[ctrlv1.UpdateResolverResponse], error) {
	m := req.Msg
	return Respond(upstreams.Update(ctx, s.objects, Mutation[*ctrlv1.UpdateResolverResponse](req, m.GetCommand()),
		m.GetResolverId(), m.GetExpectedRevision(), m.GetSpec(), m.DrainSeconds,
		func(o upstreams.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverResponse {
			return &ctrlv1.UpdateResolverResponse{Resolver: toResolver(o)}
		}))
}

func (s *ResolverService) DeleteResolver(ctx context.Context, req *connect.Request[ctrlv1.DeleteResolverRequest]) (*connect.Response[ctrlv1.DeleteResolverResponse], error) {
	m := req.Msg
	return Respond(upstreams.Delete(ctx, s.objects, Mutation[*ctrlv1.DeleteResolverResponse](req, m.GetCommand()),
		m.GetResolverId(), func() *ctrlv1.DeleteResolverResponse { return &ctrlv1.DeleteResolverResponse{} }))
}

func (s *ResolverService) UpdateResolverLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverLabelsRequest]) (*connect.Response[ctrlv1.UpdateResolverLabelsResponse], error) {
	m := req.Msg
	return Respond(upstreams.UpdateMap(ctx, s.objects, Mutation[*ctrlv1.UpdateResolverLabelsResponse](req, m.GetCommand()),
		resource.Labels, m.GetResolverId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(o upstreams.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverLabelsResponse {
			return &ctrlv1.UpdateResolverLabelsResponse{Resolver: toResolver(o)}
		}))
}

func (s *ResolverService) UpdateResolverAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateResolverAnnotationsResponse], error) {
	m := req.Msg
	return Respond(upstreams.UpdateMap(ctx, s.objects, Mutation[*ctrlv1.UpdateResolverAnnotationsResponse](req, m.GetCommand()),
		resource.Annotations, m.GetResolverId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(o upstreams.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverAnnotationsResponse {
			return &ctrlv1.UpdateResolverAnnotationsResponse{Resolver: toResolver(o)}
		}))
}
