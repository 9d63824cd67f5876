package api

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/internal/ctrl/projects"
	"github.com/kibotos/kibotos/internal/ctrl/scheduler"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

func (s *AdminService) CreateHostToken(ctx context.Context, req *connect.Request[adminv1.CreateHostTokenRequest]) (*connect.Response[adminv1.CreateHostTokenResponse], error) {
	tok, secret, err := s.projects.CreateHostToken(ctx, req.Msg.GetName(), req.Msg.GetHostIds(), req.Msg.GetAnyHost())
	return Respond(&adminv1.CreateHostTokenResponse{HostToken: toHostToken(tok), Secret: secret}, err)
}

func (s *AdminService) ListHostTokens(ctx context.Context, req *connect.Request[adminv1.ListHostTokensRequest]) (*connect.Response[adminv1.ListHostTokensResponse], error) {
	toks, err := s.projects.ListHostTokens(ctx)
	out := &adminv1.ListHostTokensResponse{}
	for _, t := range toks {
		out.HostTokens = append(out.HostTokens, toHostToken(t))
	}
	return Respond(out, err)
}

func (s *AdminService) RevokeHostToken(ctx context.Context, req *connect.Request[adminv1.RevokeHostTokenRequest]) (*connect.Response[adminv1.RevokeHostTokenResponse], error) {
	tok, err := s.projects.RevokeHostToken(ctx, req.Msg.GetHostTokenId())
	return Respond(&adminv1.RevokeHostTokenResponse{HostToken: toHostToken(tok)}, err)
}

func (s *AdminService) ListHosts(ctx context.Context, req *connect.Request[adminv1.ListHostsRequest]) (*connect.Response[adminv1.ListHostsResponse], error) {
	if s.workspaces == nil {
		return s.UnimplementedAdminServiceHandler.ListHosts(ctx, req)
	}
	if err := projects.Operator(ctx, "list hosts"); err != nil {
		return nil, err
	}
	hosts, err := s.workspaces.ListHosts(ctx)
	out := &adminv1.ListHostsResponse{}
	for _, h := range hosts {
		out.Hosts = append(out.Hosts, toHost(h))
	}
	return Respond(out, err)
}

func (s *AdminService) DrainHost(ctx context.Context, req *connect.Request[adminv1.DrainHostRequest]) (*connect.Response[adminv1.DrainHostResponse], error) {
	if s.workspaces == nil {
		return s.UnimplementedAdminServiceHandler.DrainHost(ctx, req)
	}
	if err := projects.Operator(ctx, "drain hosts"); err != nil {
		return nil, err
	}
	h, err := s.workspaces.DrainHost(ctx, req.Msg.GetHostId(), req.Msg.GetDrained())
	return Respond(&adminv1.DrainHostResponse{Host: toHost(h)}, err)
}

func toHostToken(t store.HostToken) *adminv1.HostToken {
	if t.ID == "" {
		return nil
	}
	out := &adminv1.HostToken{HostTokenId: t.ID, Name: t.Name, CreatedAt: timestamppb.New(t.CreatedAt), HostIds: t.HostIDs, AnyHost: t.AnyHost}
	if !t.RevokedAt.IsZero() {
		out.RevokedAt = timestamppb.New(t.RevokedAt)
	}
	return out
}

func toHost(h workspaces.HostView) *adminv1.Host {
	if h.ID == "" {
		return nil
	}
	reg := h.Registration
	out := &adminv1.Host{HostId: h.ID, State: adminv1.HostState_HOST_STATE_READY, Drained: h.Drained,
		Capacity: toHostResources(h.Capacity), Reserved: toHostResources(h.Reserved),
		Capabilities: reg.GetCapabilities(), Runtimes: reg.GetRuntimes(), DataPlaneEndpoint: reg.GetDataPlaneEndpoint(),
		LastReportAt: timestamppb.New(h.SeenAt), Workspaces: uint32(h.Workspaces)}
	if h.Lost {
		out.State = adminv1.HostState_HOST_STATE_LOST
	}
	for _, p := range reg.GetStoragePools() {
		out.StoragePools = append(out.StoragePools, p.Name)
	}
	return out
}

func toHostResources(r scheduler.Resources) *adminv1.HostResources {
	return &adminv1.HostResources{CpuMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, LayerBytes: r.LayerBytes}
}
