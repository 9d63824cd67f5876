package api

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/objects"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/upstream"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

// ResolverService serves kibotos.ctrl.v1.ResolverService.
type ResolverService struct {
	ctrlv1connect.UnimplementedResolverServiceHandler
	objects *objects.Service[*ctrlv1.ResolverSpec]
}

func resolverKind() objects.Kind[*ctrlv1.ResolverSpec] {
	return objects.Kind[*ctrlv1.ResolverSpec]{
		Store:    store.KindResolver,
		Noun:     "Resolver",
		IDPrefix: "rsv",
		NewSpec:  func() *ctrlv1.ResolverSpec { return new(ctrlv1.ResolverSpec) },
		Check:    upstream.CheckResolverSpec,
		// A policy was checked against the Resolver's protocol (a udp one
		// needs an Egress with udp_enabled): while one references it, the
		// protocol stays.
		CheckUpdate: func(ctx context.Context, tx store.Tx, projectID, id string, old, new *ctrlv1.ResolverSpec) error {
			if protocolOf(old) == protocolOf(new) {
				return nil
			}
			ws, err := tx.ReferencingWorkspaces(ctx, projectID, store.PolicyReference{Kind: store.RefResolver, TargetID: id}, 1)
			if err != nil || len(ws) == 0 {
				return err
			}
			return workspaces.InUse(ctx, tx, projectID, ws[0],
				"Resolver %q is referenced by the network policy of workspace %q: its protocol cannot change while a policy references it",
				id, ws[0])
		},
		Referenced: store.RefResolver,
		InUse:      workspaces.InUse,
		// A Resolver holds no secret: reads return it whole.
		Redact: proto.CloneOf[*ctrlv1.ResolverSpec],
	}
}

// protocolOf names the selected protocol branch of a spec.
func protocolOf(spec *ctrlv1.ResolverSpec) string {
	return fmt.Sprintf("%T", spec.GetProtocol())
}

func toResolver(o objects.Object[*ctrlv1.ResolverSpec]) *ctrlv1.Resolver {
	return &ctrlv1.Resolver{
		ResolverId: o.ID, Spec: o.Spec, Revision: o.Revision,
		CreatedAt: timestamppb.New(o.CreatedAt), UpdatedAt: timestamppb.New(o.UpdatedAt),
		Labels: o.Labels, Annotations: o.Annotations,
		LabelsRevision: o.LabelsRevision, AnnotationsRevision: o.AnnotationsRevision,
	}
}

func (s *ResolverService) CreateResolver(ctx context.Context, req *connect.Request[ctrlv1.CreateResolverRequest]) (*connect.Response[ctrlv1.CreateResolverResponse], error) {
	m := req.Msg
	return Respond(objects.Create(ctx, s.objects, Mutation[*ctrlv1.CreateResolverResponse](req, m.GetCommand()),
		m.GetSpec(), m.GetLabels(), m.GetAnnotations(),
		func(o objects.Object[*ctrlv1.ResolverSpec]) *ctrlv1.CreateResolverResponse {
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
	return Respond(objects.Update(ctx, s.objects, Mutation[*ctrlv1.UpdateResolverResponse](req, m.GetCommand()),
		m.GetResolverId(), m.GetExpectedRevision(), m.GetSpec(), m.DrainSeconds,
		func(o objects.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverResponse {
			return &ctrlv1.UpdateResolverResponse{Resolver: toResolver(o)}
		}))
}

func (s *ResolverService) DeleteResolver(ctx context.Context, req *connect.Request[ctrlv1.DeleteResolverRequest]) (*connect.Response[ctrlv1.DeleteResolverResponse], error) {
	m := req.Msg
	return Respond(objects.Delete(ctx, s.objects, Mutation[*ctrlv1.DeleteResolverResponse](req, m.GetCommand()),
		m.GetResolverId(), func() *ctrlv1.DeleteResolverResponse { return &ctrlv1.DeleteResolverResponse{} }))
}

func (s *ResolverService) UpdateResolverLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverLabelsRequest]) (*connect.Response[ctrlv1.UpdateResolverLabelsResponse], error) {
	m := req.Msg
	return Respond(objects.UpdateLabels(ctx, s.objects, Mutation[*ctrlv1.UpdateResolverLabelsResponse](req, m.GetCommand()),
		m.GetResolverId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(o objects.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverLabelsResponse {
			return &ctrlv1.UpdateResolverLabelsResponse{Resolver: toResolver(o)}
		}))
}

func (s *ResolverService) UpdateResolverAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateResolverAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateResolverAnnotationsResponse], error) {
	m := req.Msg
	return Respond(objects.UpdateAnnotations(ctx, s.objects, Mutation[*ctrlv1.UpdateResolverAnnotationsResponse](req, m.GetCommand()),
		m.GetResolverId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(o objects.Object[*ctrlv1.ResolverSpec]) *ctrlv1.UpdateResolverAnnotationsResponse {
			return &ctrlv1.UpdateResolverAnnotationsResponse{Resolver: toResolver(o)}
		}))
}
