package api

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/objects"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/upstream"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// EgressService serves kibotos.ctrl.v1.EgressService.
type EgressService struct {
	ctrlv1connect.UnimplementedEgressServiceHandler
	objects *objects.Service[*ctrlv1.EgressSpec]
}

func egressKind(checker *netcheck.Checker) objects.Kind[*ctrlv1.EgressSpec] {
	return objects.Kind[*ctrlv1.EgressSpec]{
		Store:    store.KindEgress,
		Noun:     "Egress",
		IDPrefix: "egr",
		NewSpec:  func() *ctrlv1.EgressSpec { return new(ctrlv1.EgressSpec) },
		Check:    upstream.CheckEgressSpec,
		CheckSlow: func(ctx context.Context, spec *ctrlv1.EgressSpec) error {
			return upstream.CheckEgressEndpoint(ctx, checker, spec)
		},
		CheckUpdate: func(ctx context.Context, tx store.Tx, projectID, id string, old, new *ctrlv1.EgressSpec) error {
			if !old.GetUdpEnabled() || new.GetUdpEnabled() {
				return nil
			}
			ws, err := tx.ReferencingWorkspaces(ctx, projectID, store.PolicyReference{Kind: store.RefEgressUDP, TargetID: id}, 1)
			if err != nil || len(ws) == 0 {
				return err
			}
			return workspaces.InUse(ctx, tx, projectID, ws[0],
				"udp_enabled cannot be turned off: the network policy of workspace %q sends a udp Resolver's queries through Egress %q",
				ws[0], id)
		},
		Referenced: store.RefEgress,
		InUse:      workspaces.InUse,
		Redact:     upstream.RedactEgressSpec,
	}
}

func toEgress(o objects.Object[*ctrlv1.EgressSpec]) *ctrlv1.Egress {
	return &ctrlv1.Egress{
		EgressId: o.ID, Spec: o.Spec, Revision: o.Revision,
		CreatedAt: timestamppb.New(o.CreatedAt), UpdatedAt: timestamppb.New(o.UpdatedAt),
		Labels: o.Labels, Annotations: o.Annotations,
		LabelsRevision: o.LabelsRevision, AnnotationsRevision: o.AnnotationsRevision,
	}
}

func (s *EgressService) CreateEgress(ctx context.Context, req *connect.Request[ctrlv1.CreateEgressRequest]) (*connect.Response[ctrlv1.CreateEgressResponse], error) {
	m := req.Msg
	return Respond(objects.Create(ctx, s.objects, Mutation[*ctrlv1.CreateEgressResponse](req, m.GetCommand()),
		m.GetSpec(), m.GetLabels(), m.GetAnnotations(),
		func(o objects.Object[*ctrlv1.EgressSpec]) *ctrlv1.CreateEgressResponse {
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
	return Respond(objects.Update(ctx, s.objects, Mutation[*ctrlv1.UpdateEgressResponse](req, m.GetCommand()),
		m.GetEgressId(), m.GetExpectedRevision(), m.GetSpec(), m.DrainSeconds,
		func(o objects.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressResponse {
			return &ctrlv1.UpdateEgressResponse{Egress: toEgress(o)}
		}))
}

func (s *EgressService) DeleteEgress(ctx context.Context, req *connect.Request[ctrlv1.DeleteEgressRequest]) (*connect.Response[ctrlv1.DeleteEgressResponse], error) {
	m := req.Msg
	return Respond(objects.Delete(ctx, s.objects, Mutation[*ctrlv1.DeleteEgressResponse](req, m.GetCommand()),
		m.GetEgressId(), func() *ctrlv1.DeleteEgressResponse { return &ctrlv1.DeleteEgressResponse{} }))
}

func (s *EgressService) UpdateEgressLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressLabelsRequest]) (*connect.Response[ctrlv1.UpdateEgressLabelsResponse], error) {
	m := req.Msg
	return Respond(objects.UpdateLabels(ctx, s.objects, Mutation[*ctrlv1.UpdateEgressLabelsResponse](req, m.GetCommand()),
		m.GetEgressId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(o objects.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressLabelsResponse {
			return &ctrlv1.UpdateEgressLabelsResponse{Egress: toEgress(o)}
		}))
}

func (s *EgressService) UpdateEgressAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateEgressAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateEgressAnnotationsResponse], error) {
	m := req.Msg
	return Respond(objects.UpdateAnnotations(ctx, s.objects, Mutation[*ctrlv1.UpdateEgressAnnotationsResponse](req, m.GetCommand()),
		m.GetEgressId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(o objects.Object[*ctrlv1.EgressSpec]) *ctrlv1.UpdateEgressAnnotationsResponse {
			return &ctrlv1.UpdateEgressAnnotationsResponse{Egress: toEgress(o)}
		}))
}
