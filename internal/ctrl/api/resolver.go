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
	kind upstreamKind[*ctrlv1.ResolverSpec, *ctrlv1.Resolver]
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
	return createUpstream(ctx, s.kind, req,
		func(r *ctrlv1.Resolver) *ctrlv1.CreateResolverResponse {
			return &ctrlv1.CreateResolverResponse{Resolver: r}
		})
}

func (s *ResolverService) GetResolver(ctx context.Context, req *connect.Request[ctrlv1.GetResolverRequest]) (*connect.Response[ctrlv1.GetResolverResponse], error) {
	return getUpstream(ctx, s.kind, req.Msg.GetResolverId(),
		func(r *ctrlv1.Resolver) *ctrlv1.GetResolverResponse { return &ctrlv1.GetResolverResponse{Resolver: r} })
}

func (s *ResolverService) ListResolvers(ctx context.Context, req *connect.Request[ctrlv1.ListResolversRequest]) (*connect.Response[ctrlv1.ListResolversResponse], error) {
	return listUpstreams(ctx, s.kind, req.Msg, func(resolvers []*ctrlv1.Resolver, next string) *ctrlv1.ListResolversResponse {
		return &ctrlv1.ListResolversResponse{Resolvers: resolvers, NextPageToken: next}
	})
}

func (s *ResolverService) UpdateResolver(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverRequest]) (*connect.Response[ctrlv1.UpdateResolverResponse], error) {
	return updateUpstream(ctx, s.kind, req, req.Msg.GetResolverId(), req.Msg.DrainSeconds,
		func(r *ctrlv1.Resolver) *ctrlv1.UpdateResolverResponse {
			return &ctrlv1.UpdateResolverResponse{Resolver: r}
		})
}

func (s *ResolverService) DeleteResolver(ctx context.Context, req *connect.Request[ctrlv1.DeleteResolverRequest]) (*connect.Response[ctrlv1.DeleteResolverResponse], error) {
	return deleteUpstream(ctx, s.kind, req, req.Msg.GetResolverId(),
		func() *ctrlv1.DeleteResolverResponse { return &ctrlv1.DeleteResolverResponse{} })
}

func (s *ResolverService) UpdateResolverLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverLabelsRequest]) (*connect.Response[ctrlv1.UpdateResolverLabelsResponse], error) {
	m := req.Msg
	return updateUpstreamMap(ctx, s.kind, req, resource.Labels, m.GetResolverId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(r *ctrlv1.Resolver) *ctrlv1.UpdateResolverLabelsResponse {
			return &ctrlv1.UpdateResolverLabelsResponse{Resolver: r}
		})
}

func (s *ResolverService) UpdateResolverAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateResolverAnnotationsResponse], error) {
	m := req.Msg
	return updateUpstreamMap(ctx, s.kind, req, resource.Annotations, m.GetResolverId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(r *ctrlv1.Resolver) *ctrlv1.UpdateResolverAnnotationsResponse {
			return &ctrlv1.UpdateResolverAnnotationsResponse{Resolver: r}
		})
}
