package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
)

// VolumeService serves kibotos.ctrl.v1.VolumeService.
type VolumeService struct {
	ctrlv1connect.UnimplementedVolumeServiceHandler
	svc *volumes.Service
}

// NewVolumeService returns the VolumeService handler.
func NewVolumeService(svc *volumes.Service) *VolumeService { return &VolumeService{svc: svc} }

func (s *VolumeService) CreateVolume(ctx context.Context, req *connect.Request[ctrlv1.CreateVolumeRequest]) (*connect.Response[ctrlv1.CreateVolumeResponse], error) {
	m := req.Msg
	return Respond(volumes.Create(ctx, s.svc, Mutation[*ctrlv1.CreateVolumeResponse](req, m.GetCommand()),
		m.GetSpec(), m.GetLabels(), m.GetAnnotations(),
		func(v *ctrlv1.Volume) *ctrlv1.CreateVolumeResponse { return &ctrlv1.CreateVolumeResponse{Volume: v} }))
}

func (s *VolumeService) GetVolume(ctx context.Context, req *connect.Request[ctrlv1.GetVolumeRequest]) (*connect.Response[ctrlv1.GetVolumeResponse], error) {
	v, err := s.svc.Get(ctx, req.Msg.GetVolumeId())
	return Respond(&ctrlv1.GetVolumeResponse{Volume: v}, err)
}

func (s *VolumeService) ListVolumes(ctx context.Context, req *connect.Request[ctrlv1.ListVolumesRequest]) (*connect.Response[ctrlv1.ListVolumesResponse], error) {
	m := req.Msg
	list, next, err := s.svc.List(ctx, m.GetPageSize(), m.GetPageToken(), m.GetLabelSelector())
	return Respond(&ctrlv1.ListVolumesResponse{Volumes: list, NextPageToken: next}, err)
}

func (s *VolumeService) ResizeVolume(ctx context.Context, req *connect.Request[ctrlv1.ResizeVolumeRequest]) (*connect.Response[ctrlv1.ResizeVolumeResponse], error) {
	m := req.Msg
	return Respond(volumes.Resize(ctx, s.svc, Mutation[*ctrlv1.ResizeVolumeResponse](req, m.GetCommand()),
		m.GetVolumeId(), m.GetCapacityBytes(),
		func(v *ctrlv1.Volume) *ctrlv1.ResizeVolumeResponse { return &ctrlv1.ResizeVolumeResponse{Volume: v} }))
}

func (s *VolumeService) DeleteVolume(ctx context.Context, req *connect.Request[ctrlv1.DeleteVolumeRequest]) (*connect.Response[ctrlv1.DeleteVolumeResponse], error) {
	m := req.Msg
	return Respond(volumes.Delete(ctx, s.svc, Mutation[*ctrlv1.DeleteVolumeResponse](req, m.GetCommand()), m.GetVolumeId(),
		func(v *ctrlv1.Volume) *ctrlv1.DeleteVolumeResponse { return &ctrlv1.DeleteVolumeResponse{Volume: v} }))
}

func (s *VolumeService) UpdateVolumeLabels(ctx context.Context, req *connect.Request[ctrlv1.UpdateVolumeLabelsRequest]) (*connect.Response[ctrlv1.UpdateVolumeLabelsResponse], error) {
	m := req.Msg
	return Respond(volumes.UpdateMap(ctx, s.svc, Mutation[*ctrlv1.UpdateVolumeLabelsResponse](req, m.GetCommand()),
		resource.Labels, m.GetVolumeId(), m.GetExpectedLabelsRevision(), m.GetLabels(),
		func(v *ctrlv1.Volume) *ctrlv1.UpdateVolumeLabelsResponse {
			return &ctrlv1.UpdateVolumeLabelsResponse{Volume: v}
		}))
}

func (s *VolumeService) UpdateVolumeAnnotations(ctx context.Context, req *connect.Request[ctrlv1.UpdateVolumeAnnotationsRequest]) (*connect.Response[ctrlv1.UpdateVolumeAnnotationsResponse], error) {
	m := req.Msg
	return Respond(volumes.UpdateMap(ctx, s.svc, Mutation[*ctrlv1.UpdateVolumeAnnotationsResponse](req, m.GetCommand()),
		resource.Annotations, m.GetVolumeId(), m.GetExpectedAnnotationsRevision(), m.GetAnnotations(),
		func(v *ctrlv1.Volume) *ctrlv1.UpdateVolumeAnnotationsResponse {
			return &ctrlv1.UpdateVolumeAnnotationsResponse{Volume: v}
		}))
}
