package transfers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

// Restore creates a new workspace from a COMPLETE or IMPORTED Transfer,
// which becomes RESTORING until the workspace first runs (Follow).
func Restore[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, labels, annotations map[string]string,
	respond func(*ctrlv1.Workspace, *ctrlv1.Transfer) R) (R, error) {
	var zero R
	if id == "" {
		return zero, invalid("transfer_id is required")
	}
	if err := resource.CheckMaps(labels, annotations); err != nil {
		return zero, err
	}
	if err := s.carryTemplate(ctx, id); err != nil {
		return zero, err
	}
	var wsID string
	resp, err := resource.Run(ctx, s.Store, w, func(ctx context.Context, tx store.Tx, projectID string) (R, error) {
		r, err := load(ctx, tx, projectID, id)
		if err != nil {
			return zero, err
		}
		switch r.T.State {
		case ctrlv1.TransferState_TRANSFER_STATE_COMPLETE, ctrlv1.TransferState_TRANSFER_STATE_IMPORTED:
		default:
			return zero, precondition("transfer %s is %s; only a COMPLETE or IMPORTED transfer can be restored", id, StateName(r.T.State))
		}
		m := r.T.Manifest
		ref, found, err := templates.FindByDigest(ctx, tx, projectID, m.GetTemplate().GetTemplateId(), m.GetTemplateImageDigest())
		if err != nil {
			return zero, err
		}
		if !found {
			return zero, missingTemplate(m)
		}
		spec := &ctrlv1.WorkspaceCreateSpec{
			Template:  &ctrlv1.TemplateSelector{TemplateId: ref.TemplateId, Revision: ref.Revision},
			Resources: m.Resources,
			Volume:    &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE},
			// Egresses and Resolvers are named in the manifest, not carried.
			NetworkPolicy: &ctrlv1.NetworkPolicy{Mode: m.GetNetworkPolicy().GetMode(), Allow: m.GetNetworkPolicy().GetAllow(),
				Deny: m.GetNetworkPolicy().GetDeny()},
		}
		if m.VolumeCapacityBytes > 0 {
			on := true
			spec.Volume = &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW,
				MountPath: m.VolumeMountPath, DeleteWithWorkspace: &on}
		}
		ws, err := s.Workspaces.CreateRestored(ctx, tx, projectID, spec, labels, annotations, workspaces.Restore{
			TransferID: id, Digest: m.Digest, SizeBytes: m.SizeBytes, VolumeBytes: m.VolumeCapacityBytes})
		if err != nil {
			return zero, err
		}
		wsID = ws.WorkspaceId
		r.T.State = ctrlv1.TransferState_TRANSFER_STATE_RESTORING
		r.T.RestoredWorkspaceId = ws.WorkspaceId
		r.T.Progress = progress(0, m.SizeBytes, s.Now.UTC())
		if err := s.save(ctx, tx, r); err != nil {
			return zero, err
		}
		return respond(ws, r.View()), nil
	})
	if err == nil {
		s.Workspaces.Changes.Publish(wsID)
	}
	return resp, err
}

// carryTemplate imports the Template revision the artifact of a COMPLETE
// or IMPORTED Transfer carries when this deployment has no revision of its
// image (templates.ImportCarried), outside the restore's transaction: the
// image store verifies every blob of it as a template import does. It does
// nothing for a Transfer that carries none, or whose revision exists, or
// that this caller cannot restore (the restore says why).
func (s *Service) carryTemplate(ctx context.Context, id string) error {
	c, _ := auth.CallerFrom(ctx)
	var m *ctrlv1.TransferManifest
	err := s.Store.View(ctx, func(tx store.Tx) error {
		r, err := load(ctx, tx, c.ProjectID, id)
		if err != nil || !r.T.GetManifest().GetCarriesTemplate() {
			return nil
		}
		switch r.T.State {
		case ctrlv1.TransferState_TRANSFER_STATE_COMPLETE, ctrlv1.TransferState_TRANSFER_STATE_IMPORTED:
		default:
			return nil
		}
		_, found, err := templates.FindByDigest(ctx, tx, c.ProjectID, r.T.Manifest.GetTemplate().GetTemplateId(), r.T.Manifest.GetTemplateImageDigest())
		if err == nil && !found {
			m = r.T.Manifest
		}
		return err
	})
	if err != nil || m == nil || s.Templates == nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Join(s.Templates.Images.Dir(), "tmp"), "carried-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rd, err := s.Bucket.NewReader(ctx, artifactKey(id), nil)
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("reading the artifact of transfer %s: %w", id, err))
	}
	defer rd.Close()
	if _, err := artifact.Extract(ctx, rd, map[string]string{artifact.Template: dir}); err != nil {
		return connect.NewError(connect.CodeDataLoss, fmt.Errorf("the template transfer %s carries: %w", id, err))
	}
	_, err = s.Templates.ImportCarried(ctx, c.ProjectID, m.GetTemplate().GetTemplateId(), m.GetTemplateImageDigest(), dir,
		templates.SourceTransfer+id)
	return err
}

// missingTemplate is the failed_precondition of a restore whose Template
// revision this deployment lacks.
func missingTemplate(m *ctrlv1.TransferManifest) error {
	err := connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
		"no template revision with image %s (template %s revision %s) exists in this deployment: import that image as a template revision first",
		m.GetTemplateImageDigest(), m.GetTemplate().GetTemplateId(), m.GetTemplate().GetRevision()))
	if d, derr := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND,
		Stage: ctrlv1.FailureStage_FAILURE_STAGE_RESTORING_WORKSPACE}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// follow moves a RESTORING Transfer by what became of its workspace:
// RESTORED once it first ran, FAILED when it failed or went away first.
// It reports whether the record changed.
func (s *Service) follow(ctx context.Context, tx store.Tx, r *Record) (bool, error) {
	ws, err := s.Workspaces.Restored(ctx, tx, r.Row.ProjectID, r.T.RestoredWorkspaceId)
	if connect.CodeOf(err) == connect.CodeNotFound {
		s.fail(r, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, ctrlv1.FailureStage_FAILURE_STAGE_RESTORING_WORKSPACE,
			fmt.Sprintf("workspace %s is gone", r.T.RestoredWorkspaceId))
		return true, nil
	}
	if err != nil {
		return false, err
	}
	switch {
	case ws.Generation > 0:
		r.T.State = ctrlv1.TransferState_TRANSFER_STATE_RESTORED
		r.T.Progress = nil
	case ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
		f := ws.GetFailure()
		s.fail(r, f.GetReason(), ctrlv1.FailureStage_FAILURE_STAGE_RESTORING_WORKSPACE,
			fmt.Sprintf("workspace %s failed at %s: %s", ws.WorkspaceId, f.GetStage(), f.GetMessage()))
	case ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING, ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
		s.fail(r, ctrlv1.FailureReason_FAILURE_REASON_CANCELLED, ctrlv1.FailureStage_FAILURE_STAGE_RESTORING_WORKSPACE,
			fmt.Sprintf("workspace %s was deleted before it first ran", ws.WorkspaceId))
	default:
		return false, nil
	}
	return true, nil
}
