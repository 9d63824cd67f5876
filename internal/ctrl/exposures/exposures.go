// Package exposures is ctrl's ExposureService: public URLs that reach a
// TCP port of a workspace's guest, served by the host that runs the
// workspace. It keeps each exposure in the store (the token only as a
// hash), gives the host of a running workspace its live exposures in the
// assignment (workspaces.Exposures), and ends them with the workspace's
// execution unless they are persistent.
package exposures

import (
	"cmp"
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/exposureabi"
)

// MaxPerWorkspace bounds the live exposures of one workspace (each is sent
// to its host in every assignment).
const MaxPerWorkspace = 100

// Service implements the exposure methods.
type Service struct {
	Store      store.Store
	Workspaces *workspaces.Service
	Pages      *pagetoken.Codec
	// Now is the clock; nil is time.Now.
	Now resource.Clock
}

var _ workspaces.Exposures = (*Service)(nil)

// Create exposes a guest port of an AVAILABLE workspace of the caller's
// project. Under TOKEN the response carries the exposure's token; the
// command's record keeps the response without it, so a replay returns the
// exposure without its token.
func (s *Service) Create(ctx context.Context, w resource.Mutation[*ctrlv1.CreateExposureResponse], workspaceID string,
	port uint32, authMode ctrlv1.ExposureAuth, persistent bool) (*ctrlv1.CreateExposureResponse, error) {
	switch {
	case workspaceID == "":
		return nil, resource.Invalid("workspace_id is required")
	case port == 0 || port > 65535:
		return nil, resource.Invalid("port %d is out of range: it must be 1 to 65535", port)
	}
	switch authMode {
	case ctrlv1.ExposureAuth_EXPOSURE_AUTH_UNSPECIFIED:
		authMode = ctrlv1.ExposureAuth_EXPOSURE_AUTH_TOKEN
	case ctrlv1.ExposureAuth_EXPOSURE_AUTH_TOKEN, ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC:
	default:
		return nil, resource.Invalid("auth %d is not a known exposure auth", authMode)
	}
	// created is the exposure this call stored and its token: a replay (or
	// a retry that found the command recorded) returns another response.
	var created struct{ id, token string }
	resp, err := resource.Run(ctx, s.Store, w, func(ctx context.Context, tx store.Tx, projectID string) (*ctrlv1.CreateExposureResponse, error) {
		ws, hostID, err := s.Workspaces.Placed(ctx, tx, projectID, workspaceID)
		if err != nil {
			return nil, err
		}
		if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			return nil, precondition(ws, "workspace %s is %s; only an AVAILABLE workspace's ports can be exposed",
				workspaceID, workspaces.StateName(ws.State))
		}
		h, err := hostOf(ctx, tx, hostID)
		if err != nil {
			return nil, err
		}
		if h.endpoint == "" {
			return nil, withDetail(connect.NewError(connect.CodeUnavailable, fmt.Errorf(
				"the host running workspace %s serves no exposures", workspaceID)),
				&ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE, Stage: ctrlv1.FailureStage_FAILURE_STAGE_CREATING_EXPOSURE})
		}
		live, err := tx.WorkspaceExposures(ctx, projectID, workspaceID, "", 0)
		if err != nil {
			return nil, err
		}
		for _, e := range live {
			if e.Port == port {
				return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf(
					"port %d of workspace %s is already exposed by %s; revoke it first", port, workspaceID, e.ID))
			}
		}
		if len(live) >= MaxPerWorkspace {
			return nil, withDetail(connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
				"workspace %s already has %d exposures, the maximum", workspaceID, len(live))),
				&ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED, Stage: ctrlv1.FailureStage_FAILURE_STAGE_CREATING_EXPOSURE})
		}
		st := stored{Auth: authMode}
		created.id, created.token = ids.New("exp"), ""
		if authMode == ctrlv1.ExposureAuth_EXPOSURE_AUTH_TOKEN {
			created.token, st.TokenSHA256 = exposureabi.NewToken(created.id)
		}
		body, err := st.encode()
		if err != nil {
			return nil, err
		}
		row := store.Exposure{ProjectID: projectID, ID: created.id, WorkspaceID: workspaceID, Port: port,
			Persistent: persistent, Body: body, CreatedAt: s.Now.UTC()}
		if err := tx.CreateExposure(ctx, row); err != nil {
			return nil, err
		}
		return &ctrlv1.CreateExposureResponse{Exposure: view(row, st, h)}, nil
	})
	if err != nil {
		return nil, err
	}
	if resp.GetExposure().GetExposureId() != created.id {
		return resp, nil // a replay: the token was returned once
	}
	s.Workspaces.Changes.Publish(workspaceID)
	resp = proto.CloneOf(resp)
	resp.Exposure.Token = created.token
	return resp, nil
}

// Revoke ends an exposure of the caller's project; its host stops routing
// it as soon as the change reaches it. Revoking an ended exposure
// succeeds; an unknown one is not_found.
func (s *Service) Revoke(ctx context.Context, w resource.Mutation[*ctrlv1.RevokeExposureResponse], exposureID string) (*ctrlv1.RevokeExposureResponse, error) {
	if exposureID == "" {
		return nil, resource.Invalid("exposure_id is required")
	}
	var changed string
	resp, err := resource.Run(ctx, s.Store, w, func(ctx context.Context, tx store.Tx, projectID string) (*ctrlv1.RevokeExposureResponse, error) {
		changed = ""
		e, err := resource.Get(ctx, tx.Exposure, "exposure", projectID, exposureID)
		if err != nil {
			return nil, err
		}
		if !e.EndedAt.IsZero() {
			return &ctrlv1.RevokeExposureResponse{}, nil
		}
		if err := tx.EndExposure(ctx, projectID, exposureID, s.Now.UTC()); err != nil {
			return nil, err
		}
		changed = e.WorkspaceID
		return &ctrlv1.RevokeExposureResponse{}, nil
	})
	if err == nil && changed != "" {
		s.Workspaces.Changes.Publish(changed)
	}
	return resp, err
}

// List returns one page of the live exposures of a workspace of the
// caller's project, without tokens.
func (s *Service) List(ctx context.Context, workspaceID string, pageSize uint32, token string) ([]*ctrlv1.Exposure, string, error) {
	if workspaceID == "" {
		return nil, "", resource.Invalid("workspace_id is required")
	}
	// A page token is valid only for the workspace it was issued for.
	p, err := resource.ParsePage(ctx, s.Pages, "exposure/"+workspaceID, pageSize, token, nil)
	if err != nil {
		return nil, "", err
	}
	projectID := caller(ctx).ProjectID
	var (
		out  []*ctrlv1.Exposure
		next string
	)
	err = s.Store.View(ctx, func(tx store.Tx) error {
		out = nil
		_, hostID, err := s.Workspaces.Placed(ctx, tx, projectID, workspaceID)
		if err != nil {
			return err
		}
		h, err := hostOf(ctx, tx, hostID)
		if err != nil {
			return err
		}
		rows, err := tx.WorkspaceExposures(ctx, projectID, workspaceID, p.After, p.Size+1)
		if err != nil {
			return err
		}
		rows, next = resource.Cut(p, rows, func(e store.Exposure) string { return e.ID }, func(e store.Exposure) int { return len(e.Body) })
		for _, row := range rows {
			st, err := decode(row)
			if err != nil {
				return err
			}
			out = append(out, view(row, st, h))
		}
		return nil
	})
	return out, next, err
}

// HostAssignments implements workspaces.Exposures.
func (s *Service) HostAssignments(ctx context.Context, tx store.Tx, hostID string) (map[string][]*hostv1.ExposureAssignment, error) {
	rows, err := tx.HostExposures(ctx, hostID)
	if err != nil {
		return nil, err
	}
	out := map[string][]*hostv1.ExposureAssignment{}
	for _, row := range rows {
		st, err := decode(row)
		if err != nil {
			return nil, err
		}
		out[row.WorkspaceID] = append(out[row.WorkspaceID], assignment(row, st))
	}
	return out, nil
}

// EndWithExecution implements workspaces.Exposures.
func (s *Service) EndWithExecution(ctx context.Context, tx store.Tx, projectID, workspaceID string, deleted bool) error {
	_, err := tx.EndWorkspaceExposures(ctx, projectID, workspaceID, deleted, s.Now.UTC())
	return err
}

// hostOf returns what the host registered for exposure URLs.
func hostOf(ctx context.Context, tx store.Tx, hostID string) (host, error) {
	reg, err := workspaces.HostRegistration(ctx, tx, hostID)
	return host{endpoint: cmp.Or(reg.GetExposureEndpoint(), reg.GetDataPlaneEndpoint()), domain: reg.GetExposureDomain()}, err
}

func caller(ctx context.Context) auth.Caller {
	c, _ := auth.CallerFrom(ctx)
	return c
}

func withDetail(err *connect.Error, d *ctrlv1.ErrorDetail) error {
	if detail, derr := connect.NewErrorDetail(d); derr == nil {
		err.AddDetail(detail)
	}
	return err
}

// precondition is failed_precondition with the workspace's durable state
// and stage CREATING_EXPOSURE attached.
func precondition(ws *ctrlv1.Workspace, format string, a ...any) error {
	return withDetail(connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, a...)),
		&ctrlv1.ErrorDetail{ObservedWorkspace: ws, Stage: ctrlv1.FailureStage_FAILURE_STAGE_CREATING_EXPOSURE})
}
