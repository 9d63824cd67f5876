package api

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
)

// AdminService serves kibotos.admin.v1.AdminService: projects and tokens.
type AdminService struct {
	adminv1connect.UnimplementedAdminServiceHandler
	store   store.Store
	volumes *volumes.Service
}

// NewAdminService returns the AdminService handler. Without a volumes
// service the storage-pool calls answer unimplemented.
func NewAdminService(st store.Store, vols *volumes.Service) *AdminService {
	return &AdminService{store: st, volumes: vols}
}

// operator returns the caller when it is an admin of the operator project.
func operator(ctx context.Context, what string) error {
	c, err := admin(ctx)
	if err == nil && !c.Operator {
		err = connect.NewError(connect.CodePermissionDenied, fmt.Errorf("only an admin token of the operator project may %s", what))
	}
	return err
}

func (s *AdminService) ListStoragePools(ctx context.Context, req *connect.Request[adminv1.ListStoragePoolsRequest]) (*connect.Response[adminv1.ListStoragePoolsResponse], error) {
	if s.volumes == nil {
		return s.UnimplementedAdminServiceHandler.ListStoragePools(ctx, req)
	}
	if err := operator(ctx, "list storage pools"); err != nil {
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
	if err := operator(ctx, "declare a storage pool lost"); err != nil {
		return nil, err
	}
	lost, err := s.volumes.DeclarePoolLost(ctx, req.Msg.GetStoragePool())
	return Respond(&adminv1.DeclareStoragePoolLostResponse{LostVolumeIds: lost}, err)
}

// projectName is a DNS-label-like name: short, lower case, safe in a URL
// or a file name.
var projectName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// maxTokenName bounds a token's name.
const maxTokenName = 128

var roles = map[adminv1.Role]auth.Role{
	adminv1.Role_ROLE_VIEWER: auth.Viewer,
	adminv1.Role_ROLE_EDITOR: auth.Editor,
	adminv1.Role_ROLE_ADMIN:  auth.Admin,
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

// admin returns the caller when it holds the admin role.
func admin(ctx context.Context) (auth.Caller, error) {
	c, _ := auth.CallerFrom(ctx)
	if c.Role != auth.Admin {
		return c, connect.NewError(connect.CodePermissionDenied, errors.New("this call needs an admin token"))
	}
	return c, nil
}

// manages resolves the project an admin call acts on: empty is the
// caller's; another project needs an operator admin and is otherwise
// not_found, so its existence is never revealed.
func manages(ctx context.Context, tx store.Tx, c auth.Caller, projectID string) (string, error) {
	if projectID == "" || projectID == c.ProjectID {
		return c.ProjectID, nil
	}
	notFound := connect.NewError(connect.CodeNotFound, fmt.Errorf("project %q not found", projectID))
	if !c.Operator {
		return "", notFound
	}
	if _, err := tx.Project(ctx, projectID); errors.Is(err, store.ErrNotFound) {
		return "", notFound
	} else if err != nil {
		return "", err
	}
	return projectID, nil
}

func (s *AdminService) CreateProject(ctx context.Context, req *connect.Request[adminv1.CreateProjectRequest]) (*connect.Response[adminv1.CreateProjectResponse], error) {
	c, err := admin(ctx)
	if err != nil {
		return nil, err
	}
	if !c.Operator {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("only an admin token of the operator project may create projects"))
	}
	name := req.Msg.GetName()
	if !projectName.MatchString(name) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
			"name %q: must be 1 to 63 lower-case letters, digits and hyphens, starting and ending with a letter or digit", name))
	}
	p := store.Project{ID: ids.New("prj"), Name: name, CreatedAt: time.Now().UTC()}
	err = s.store.Update(ctx, func(tx store.Tx) error { return tx.CreateProject(ctx, p) })
	if errors.Is(err, store.ErrExists) {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("a project named %q already exists", name))
	}
	return Respond(&adminv1.CreateProjectResponse{Project: toProject(p)}, err)
}

func (s *AdminService) ListProjects(ctx context.Context, req *connect.Request[adminv1.ListProjectsRequest]) (*connect.Response[adminv1.ListProjectsResponse], error) {
	c, _ := auth.CallerFrom(ctx)
	resp := &adminv1.ListProjectsResponse{}
	err := s.store.View(ctx, func(tx store.Tx) error {
		if !c.Operator || c.Role != auth.Admin {
			p, err := tx.Project(ctx, c.ProjectID)
			resp.Projects = []*adminv1.Project{toProject(p)}
			return err
		}
		all, err := tx.Projects(ctx)
		for _, p := range all {
			resp.Projects = append(resp.Projects, toProject(p))
		}
		return err
	})
	return Respond(resp, err)
}

func (s *AdminService) CreateToken(ctx context.Context, req *connect.Request[adminv1.CreateTokenRequest]) (*connect.Response[adminv1.CreateTokenResponse], error) {
	c, err := admin(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	role, ok := roles[m.GetRole()]
	if !ok {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("role %v: must be ROLE_VIEWER, ROLE_EDITOR or ROLE_ADMIN", m.GetRole()))
	}
	if len(m.GetName()) > maxTokenName || !utf8.ValidString(m.GetName()) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("name must be valid UTF-8 of at most %d bytes", maxTokenName))
	}
	resp := &adminv1.CreateTokenResponse{}
	err = s.store.Update(ctx, func(tx store.Tx) error {
		projectID, err := manages(ctx, tx, c, m.GetProjectId())
		if err != nil {
			return err
		}
		tok, secret := auth.NewToken(projectID, role, m.GetName(), time.Now().UTC())
		resp.Token, resp.Secret = toToken(tok), secret
		return tx.CreateToken(ctx, tok)
	})
	return Respond(resp, err)
}

func (s *AdminService) ListTokens(ctx context.Context, req *connect.Request[adminv1.ListTokensRequest]) (*connect.Response[adminv1.ListTokensResponse], error) {
	c, err := admin(ctx)
	if err != nil {
		return nil, err
	}
	resp := &adminv1.ListTokensResponse{}
	err = s.store.View(ctx, func(tx store.Tx) error {
		projectID, err := manages(ctx, tx, c, req.Msg.GetProjectId())
		if err != nil {
			return err
		}
		toks, err := tx.Tokens(ctx, projectID)
		for _, t := range toks {
			resp.Tokens = append(resp.Tokens, toToken(t))
		}
		return err
	})
	return Respond(resp, err)
}

func (s *AdminService) RevokeToken(ctx context.Context, req *connect.Request[adminv1.RevokeTokenRequest]) (*connect.Response[adminv1.RevokeTokenResponse], error) {
	c, err := admin(ctx)
	if err != nil {
		return nil, err
	}
	id := req.Msg.GetTokenId()
	resp := &adminv1.RevokeTokenResponse{}
	err = s.store.Update(ctx, func(tx store.Tx) error {
		tok, err := tx.Token(ctx, id)
		if errors.Is(err, store.ErrNotFound) || err == nil && tok.ProjectID != c.ProjectID && !c.Operator {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("token %q not found", id))
		}
		if err != nil {
			return err
		}
		if tok.RevokedAt.IsZero() {
			if err := keepsOperatorAdmin(ctx, tx, tok); err != nil {
				return err
			}
			tok.RevokedAt = time.Now().UTC()
			if err := tx.RevokeToken(ctx, id, tok.RevokedAt); err != nil {
				return err
			}
		}
		resp.Token = toToken(tok)
		return nil
	})
	return Respond(resp, err)
}

// keepsOperatorAdmin refuses to revoke the operator project's last valid
// admin token: without one, nobody could administer the deployment.
func keepsOperatorAdmin(ctx context.Context, tx store.Tx, tok store.Token) error {
	if auth.Role(tok.Role) != auth.Admin {
		return nil
	}
	p, err := tx.Project(ctx, tok.ProjectID)
	if err != nil || !p.Operator {
		return err
	}
	toks, err := tx.Tokens(ctx, p.ID)
	if err != nil {
		return err
	}
	for _, t := range toks {
		if t.ID != tok.ID && t.RevokedAt.IsZero() && auth.Role(t.Role) == auth.Admin {
			return nil
		}
	}
	return connect.NewError(connect.CodeFailedPrecondition, errors.New(
		"this is the operator project's last valid admin token; create another admin token before revoking it"))
}
