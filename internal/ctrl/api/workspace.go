package api

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

// watchPoll bounds how long WatchWorkspace can miss a change made by
// another ctrl replica.
const watchPoll = 2 * time.Second

// WorkspaceService serves kibotos.ctrl.v1.WorkspaceService.
type WorkspaceService struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	svc *workspaces.Service
}

// NewWorkspaceService returns the WorkspaceService handler.
func NewWorkspaceService(svc *workspaces.Service) *WorkspaceService {
	return &WorkspaceService{svc: svc}
}

func (s *WorkspaceService) CreateWorkspace(ctx context.Context, req *connect.Request[ctrlv1.CreateWorkspaceRequest]) (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
	m := req.Msg
	w := Mutation[*ctrlv1.CreateWorkspaceResponse](req, m.GetCommand())
	w.Input = withoutPolicyRevision(m, func(m *ctrlv1.CreateWorkspaceRequest) *ctrlv1.NetworkPolicy {
		return m.GetSpec().GetNetworkPolicy()
	})
	return Respond(workspaces.Create(ctx, s.svc, w,
		m.GetSpec(), m.GetLabels(), m.GetAnnotations(),
		func(ws *ctrlv1.Workspace) *ctrlv1.CreateWorkspaceResponse {
			return &ctrlv1.CreateWorkspaceResponse{Workspace: ws}
		}))
}

// withoutPolicyRevision returns a copy of a request without the revision of
// the network policy it carries. The server ignores that revision, so two
// requests that differ only there are the same command.
func withoutPolicyRevision[Q proto.Message](m Q, policy func(Q) *ctrlv1.NetworkPolicy) Q {
	input := proto.CloneOf(m)
	if p := policy(input); p != nil {
		p.Revision = 0
	}
	return input
}

func (s *WorkspaceService) GetWorkspace(ctx context.Context, req *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	ws, err := s.svc.Get(ctx, req.Msg.GetWorkspaceId())
	return Respond(&ctrlv1.GetWorkspaceResponse{Workspace: ws}, err)
}

func (s *WorkspaceService) ListWorkspaces(ctx context.Context, req *connect.Request[ctrlv1.ListWorkspacesRequest]) (*connect.Response[ctrlv1.ListWorkspacesResponse], error) {
	m := req.Msg
	list, next, err := s.svc.List(ctx, m.GetPageSize(), m.GetPageToken(), m.GetLabelSelector())
	return Respond(&ctrlv1.ListWorkspacesResponse{Workspaces: list, NextPageToken: next}, err)
}

func (s *WorkspaceService) WatchWorkspace(ctx context.Context, req *connect.Request[ctrlv1.WatchWorkspaceRequest], stream *connect.ServerStream[ctrlv1.WatchWorkspaceResponse]) error {
	ctx, shutDown, cancel := untilShutdown(ctx)
	defer cancel()
	err := s.svc.Watch(ctx, req.Msg.GetWorkspaceId(), watchPoll, func(ws *ctrlv1.Workspace) error {
		return stream.Send(&ctrlv1.WatchWorkspaceResponse{Workspace: ws})
	})
	_, err = Respond(&ctrlv1.WatchWorkspaceResponse{}, shutDown(err))
	return err
}

func (s *WorkspaceService) StartWorkspace(ctx context.Context, req *connect.Request[ctrlv1.StartWorkspaceRequest]) (*connect.Response[ctrlv1.StartWorkspaceResponse], error) {
	m := req.Msg
	return Respond(workspaces.Start(ctx, s.svc, Mutation[*ctrlv1.StartWorkspaceResponse](req, m.GetCommand()), m.GetWorkspaceId(),
		func(ws *ctrlv1.Workspace) *ctrlv1.StartWorkspaceResponse {
			return &ctrlv1.StartWorkspaceResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) StopWorkspace(ctx context.Context, req *connect.Request[ctrlv1.StopWorkspaceRequest]) (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
	m := req.Msg
	return Respond(workspaces.Stop(ctx, s.svc, Mutation[*ctrlv1.StopWorkspaceResponse](req, m.GetCommand()), m.GetWorkspaceId(), m.GetMode(),
		func(ws *ctrlv1.Workspace) *ctrlv1.StopWorkspaceResponse {
			return &ctrlv1.StopWorkspaceResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) DeleteWorkspace(ctx context.Context, req *connect.Request[ctrlv1.DeleteWorkspaceRequest]) (*connect.Response[ctrlv1.DeleteWorkspaceResponse], error) {
	m := req.Msg
	return Respond(workspaces.Delete(ctx, s.svc, Mutation[*ctrlv1.DeleteWorkspaceResponse](req, m.GetCommand()), m.GetWorkspaceId(),
		func(ws *ctrlv1.Workspace) *ctrlv1.DeleteWorkspaceResponse {
			return &ctrlv1.DeleteWorkspaceResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) UpdateWorkspaceLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceLabelsRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceLabelsResponse], error) {
	m := req.Msg
	return Respond(workspaces.UpdateMap(ctx, s.svc, Mutation[*ctrlv1.UpdateWorkspaceLabelsResponse](req, m.GetCommand()),
		resource.Labels, m.GetWorkspaceId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(ws *ctrlv1.Workspace) *ctrlv1.UpdateWorkspaceLabelsResponse {
			return &ctrlv1.UpdateWorkspaceLabelsResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) UpdateWorkspaceAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceAnnotationsResponse], error) {
	m := req.Msg
	return Respond(workspaces.UpdateMap(ctx, s.svc, Mutation[*ctrlv1.UpdateWorkspaceAnnotationsResponse](req, m.GetCommand()),
		resource.Annotations, m.GetWorkspaceId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(ws *ctrlv1.Workspace) *ctrlv1.UpdateWorkspaceAnnotationsResponse {
			return &ctrlv1.UpdateWorkspaceAnnotationsResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) UpdateWorkspaceExpiration(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceExpirationRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceExpirationResponse], error) {
	m := req.Msg
	return Respond(workspaces.UpdateExpiration(ctx, s.svc, Mutation[*ctrlv1.UpdateWorkspaceExpirationResponse](req, m.GetCommand()),
		m.GetWorkspaceId(), m.GetChange(),
		func(ws *ctrlv1.Workspace) *ctrlv1.UpdateWorkspaceExpirationResponse {
			return &ctrlv1.UpdateWorkspaceExpirationResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) UpdateWorkspaceMemory(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceMemoryRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceMemoryResponse], error) {
	m := req.Msg
	return Respond(workspaces.UpdateMemory(ctx, s.svc, Mutation[*ctrlv1.UpdateWorkspaceMemoryResponse](req, m.GetCommand()),
		m.GetWorkspaceId(), m.GetExpectedResourcesRevision(), m.GetMemoryBytes(),
		func(ws *ctrlv1.Workspace) *ctrlv1.UpdateWorkspaceMemoryResponse {
			return &ctrlv1.UpdateWorkspaceMemoryResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) ResizeWorkspaceWritableLayer(ctx context.Context, req *connect.Request[ctrlv1.ResizeWorkspaceWritableLayerRequest]) (*connect.Response[ctrlv1.ResizeWorkspaceWritableLayerResponse], error) {
	m := req.Msg
	return Respond(workspaces.ResizeWritableLayer(ctx, s.svc, Mutation[*ctrlv1.ResizeWorkspaceWritableLayerResponse](req, m.GetCommand()),
		m.GetWorkspaceId(), m.GetExpectedResourcesRevision(), m.GetWritableLayerBytes(),
		func(ws *ctrlv1.Workspace) *ctrlv1.ResizeWorkspaceWritableLayerResponse {
			return &ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) UpdateWorkspaceVolumeBinding(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceVolumeBindingRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceVolumeBindingResponse], error) {
	m := req.Msg
	return Respond(workspaces.UpdateVolumeBinding(ctx, s.svc, Mutation[*ctrlv1.UpdateWorkspaceVolumeBindingResponse](req, m.GetCommand()),
		m.GetWorkspaceId(), m.GetExpectedBindingRevision(), m.GetVolume(),
		func(ws *ctrlv1.Workspace) *ctrlv1.UpdateWorkspaceVolumeBindingResponse {
			return &ctrlv1.UpdateWorkspaceVolumeBindingResponse{Workspace: ws}
		}))
}

func (s *WorkspaceService) UpdateWorkspaceNetworkPolicy(ctx context.Context, req *connect.Request[ctrlv1.UpdateWorkspaceNetworkPolicyRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceNetworkPolicyResponse], error) {
	m := req.Msg
	w := Mutation[*ctrlv1.UpdateWorkspaceNetworkPolicyResponse](req, m.GetCommand())
	w.Input = withoutPolicyRevision(m, (*ctrlv1.UpdateWorkspaceNetworkPolicyRequest).GetPolicy)
	return Respond(workspaces.UpdateNetworkPolicy(ctx, s.svc, w,
		m.GetWorkspaceId(), m.GetExpectedRevision(), m.GetPolicy(), m.DrainSeconds,
		func(ws *ctrlv1.Workspace) *ctrlv1.UpdateWorkspaceNetworkPolicyResponse {
			return &ctrlv1.UpdateWorkspaceNetworkPolicyResponse{Workspace: ws}
		}))
}
