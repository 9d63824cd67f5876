package api

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/projects"
	"github.com/kibotos/kibotos/internal/ctrl/sessions"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

// AdminService serves kibotos.admin.v1.AdminService: projects and tokens,
// and the deployment's storage pools.
type AdminService struct {
	adminv1connect.UnimplementedAdminServiceHandler
	projects   *projects.Service
	volumes    *volumes.Service
	workspaces *workspaces.Service
	sessions   *sessions.Service
}

// NewAdminService returns the AdminService handler. Without a volumes
// service the storage-pool calls answer unimplemented, and without a
// workspaces service the host calls; without a sessions service a revoked
// token's data-plane sessions are left to expire.
func NewAdminService(p *projects.Service, vols *volumes.Service, ws *workspaces.Service, sess *sessions.Service) *AdminService {
	return &AdminService{projects: p, volumes: vols, workspaces: ws, sessions: sess}
}

func (s *AdminService) ListStoragePools(ctx context.Context, req *connect.Request[adminv1.ListStoragePoolsRequest]) (*connect.Response[adminv1.ListStoragePoolsResponse], error) {
	if s.volumes == nil {
		return s.UnimplementedAdminServiceHandler.ListStoragePools(ctx, req)
	}
	if err := projects.Operator(ctx, "list storage pools"); err != nil {
		return nil, err
	}
	pools, err := s.volumes.ListPools(ctx)
	out := &adminv1.ListStoragePoolsResponse{}
	for _, p := range pools {
		out.StoragePools = append(out.StoragePools, &adminv1.StoragePool{Name: p.Name, HostIds: p.HostIDs,
			DefaultVolumeBytes: p.DefaultVolumeBytes, Default: p.Default})
	}
	return Respond(out, err)
}

func (s *AdminService) DeclareStoragePoolLost(ctx context.Context, req *connect.Request[adminv1.DeclareStoragePoolLostRequest]) (*connect.Response[adminv1.DeclareStoragePoolLostResponse], error) {
	if s.volumes == nil {
		return s.UnimplementedAdminServiceHandler.DeclareStoragePoolLost(ctx, req)
	}
	if err := projects.Operator(ctx, "declare a storage pool lost"); err != nil {
		return nil, err
	}
	loss, err := s.volumes.DeclarePoolLost(ctx, req.Msg.GetStoragePool(), req.Msg.GetHostId())
	return Respond(&adminv1.DeclareStoragePoolLostResponse{LostVolumeIds: loss.Lost, HostId: loss.HostID}, err)
}

var roles = map[adminv1.Role]auth.Role{
	adminv1.Role_ROLE_VIEWER: auth.Viewer,
	adminv1.Role_ROLE_EDITOR: auth.Editor,
	adminv1.Role_ROLE_ADMIN:  auth.Admin,
}

// fromRole is the role of r; an unknown one keeps its name, which no role
// has.
func fromRole(r adminv1.Role) auth.Role {
	if role, ok := roles[r]; ok {
		return role
	}
	return auth.Role(r.String())
}

func toRole(r auth.Role) adminv1.Role {
	for k, v := range roles {
		if v == r {
			return k
		}
	}
	return adminv1.Role_ROLE_UNSPECIFIED
}

func toProject(p store.Project) *adminv1.Project {
	return &adminv1.Project{ProjectId: p.ID, Name: p.Name, CreatedAt: timestamppb.New(p.CreatedAt), Operator: p.Operator}
}

func toToken(t store.Token) *adminv1.Token {
	out := &adminv1.Token{TokenId: t.ID, ProjectId: t.ProjectID, Role: toRole(auth.Role(t.Role)), Name: t.Name,
		CreatedAt: timestamppb.New(t.CreatedAt)}
	if !t.RevokedAt.IsZero() {
		out.RevokedAt = timestamppb.New(t.RevokedAt)
	}
	return out
}

func (s *AdminService) CreateProject(ctx context.Context, req *connect.Request[adminv1.CreateProjectRequest]) (*connect.Response[adminv1.CreateProjectResponse], error) {
	p, err := s.projects.CreateProject(ctx, req.Msg.GetName())
	return Respond(&adminv1.CreateProjectResponse{Project: toProject(p)}, err)
}

func (s *AdminService) ListProjects(ctx context.Context, req *connect.Request[adminv1.ListProjectsRequest]) (*connect.Response[adminv1.ListProjectsResponse], error) {
	all, err := s.projects.ListProjects(ctx)
	resp := &adminv1.ListProjectsResponse{}
	for _, p := range all {
		resp.Projects = append(resp.Projects, toProject(p))
	}
	return Respond(resp, err)
}

func (s *AdminService) GetCaller(ctx context.Context, req *connect.Request[adminv1.GetCallerRequest]) (*connect.Response[adminv1.GetCallerResponse], error) {
	p, tok, err := s.projects.Caller(ctx)
	return Respond(&adminv1.GetCallerResponse{Project: toProject(p), Token: toToken(tok)}, err)
}

func (s *AdminService) CreateToken(ctx context.Context, req *connect.Request[adminv1.CreateTokenRequest]) (*connect.Response[adminv1.CreateTokenResponse], error) {
	m := req.Msg
	tok, secret, err := s.projects.CreateToken(ctx, m.GetProjectId(), fromRole(m.GetRole()), m.GetName())
	return Respond(&adminv1.CreateTokenResponse{Token: toToken(tok), Secret: secret}, err)
}

func (s *AdminService) ListTokens(ctx context.Context, req *connect.Request[adminv1.ListTokensRequest]) (*connect.Response[adminv1.ListTokensResponse], error) {
	toks, err := s.projects.ListTokens(ctx, req.Msg.GetProjectId())
	resp := &adminv1.ListTokensResponse{}
	for _, t := range toks {
		resp.Tokens = append(resp.Tokens, toToken(t))
	}
	return Respond(resp, err)
}

// RevokeToken revokes the token, then the data-plane sessions it issued:
// again on a retry, whose revocation of the token is a no-op.
func (s *AdminService) RevokeToken(ctx context.Context, req *connect.Request[adminv1.RevokeTokenRequest]) (*connect.Response[adminv1.RevokeTokenResponse], error) {
	tok, err := s.projects.RevokeToken(ctx, req.Msg.GetTokenId())
	if err == nil && s.sessions != nil {
		err = s.sessions.RevokeIssuedBy(ctx, tok.ProjectID, tok.ID)
	}
	return Respond(&adminv1.RevokeTokenResponse{Token: toToken(tok)}, err)
}
