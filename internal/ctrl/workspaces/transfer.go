package workspaces

// This file is what the transfers package calls, inside its own
// transactions: the source of an export, the creation of a restored
// workspace, and what became of it.

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
)

// Restore is the Transfer a workspace is restored from. Its first
// execution makes the writable layer and the Volume from the artifact
// instead of empty ones; once it ran, nothing more is restored.
type Restore struct {
	TransferID string `json:"transfer_id"`
	// Digest and SizeBytes describe the artifact.
	Digest    string `json:"digest"`
	SizeBytes uint64 `json:"size_bytes"`
	// VolumeBytes is the capacity of the Volume to restore; zero without
	// one.
	VolumeBytes uint64 `json:"volume_bytes,omitempty"`
}

// ExportSource is what an export reads of a STOPPED workspace.
type ExportSource struct {
	// Workspace is as callers read it.
	Workspace *ctrlv1.Workspace
	// HostID keeps the layer, LayerID names it.
	HostID, LayerID string
	Image           templates.Image
	// Volume is the bound Volume and VolumeBytes its capacity; nil and
	// zero without one.
	Volume      *hostv1.ExecutionVolume
	VolumeBytes uint64
}

// ExportSource returns what an export of the workspace reads. Any state
// but STOPPED is failed_precondition, naming the state, with the
// workspace attached.
func (s *Service) ExportSource(ctx context.Context, tx store.Tx, projectID, id string) (ExportSource, error) {
	r, err := s.load(ctx, tx, projectID, id)
	if err != nil {
		return ExportSource{}, err
	}
	if r.ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		return ExportSource{}, precondition(observed(ctx, tx, r),
			"workspace %s is %s; only a STOPPED workspace can be exported: stop it first", id, StateName(r.ws.State))
	}
	ws, err := present(ctx, tx, r)
	if err != nil {
		return ExportSource{}, err
	}
	src := ExportSource{Workspace: ws, HostID: r.row.HostID, LayerID: r.layerID(), Image: r.book.Image}
	v, err := boundRecord(ctx, tx, r)
	if err != nil || v == nil {
		return src, err
	}
	src.Volume = &hostv1.ExecutionVolume{VolumeId: v.V.VolumeId, StoragePool: v.V.Spec.StoragePool, MountPath: r.ws.Spec.Volume.MountPath}
	src.VolumeBytes = v.V.Spec.CapacityBytes
	return src, nil
}

// CreateRestored stores a new workspace restored from a Transfer: spec is
// checked and placed as CreateWorkspace's (a NEW Volume is made with
// restore.VolumeBytes and filled from the artifact), and its first
// execution restores its layer and Volume. It returns the workspace as
// callers read it.
func (s *Service) CreateRestored(ctx context.Context, tx store.Tx, projectID string, spec *ctrlv1.WorkspaceCreateSpec,
	labels, annotations map[string]string, restore Restore) (*ctrlv1.Workspace, error) {
	req, err := checkCreate(spec, labels, annotations)
	if err != nil {
		return nil, err
	}
	req.restore = &restore
	r, err := s.create(ctx, tx, projectID, req)
	if err != nil {
		return nil, err
	}
	return present(ctx, tx, r)
}

// Restored returns a workspace restored from a Transfer, DELETED included,
// as callers read it, so that the Transfer can follow it.
func (s *Service) Restored(ctx context.Context, tx store.Tx, projectID, id string) (*ctrlv1.Workspace, error) {
	r, err := s.load(ctx, tx, projectID, id)
	if err != nil {
		return nil, err
	}
	return observed(ctx, tx, r), nil
}

// restoreAssignment is the restore a workspace's execution performs: only
// until the workspace first ran.
func (r *record) restoreAssignment() *hostv1.ExecutionRestore {
	if r.book.Restore == nil || r.ws.Generation > 0 {
		return nil
	}
	return &hostv1.ExecutionRestore{TransferId: r.book.Restore.TransferID, Digest: r.book.Restore.Digest, SizeBytes: r.book.Restore.SizeBytes}
}

// CheckRestoring refuses a host the artifact of transferID unless the
// host is the caller's (CheckRegistered) and is assigned a workspace that
// restores from it (permission_denied): an artifact holds a workspace's
// files, which no other host has any business reading.
func (s *Service) CheckRestoring(ctx context.Context, hostID, transferID string) error {
	if err := s.CheckRegistered(ctx, hostID); err != nil {
		return err
	}
	return s.Store.View(ctx, func(tx store.Tx) error {
		restoring, err := s.RestoringFrom(ctx, tx, hostID)
		if err != nil || restoring[transferID] {
			return err
		}
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("host %s restores no workspace from transfer %s", hostID, transferID))
	})
}

// RestoringFrom returns the IDs of the Transfers that workspaces placed
// on hostID restore from, each until its workspace first runs: the
// restores whose artifact the host reads and whose progress it reports.
func (s *Service) RestoringFrom(ctx context.Context, tx store.Tx, hostID string) (map[string]bool, error) {
	records, err := s.hostRecords(ctx, tx, hostID)
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, r := range records {
		if a := r.restoreAssignment(); a != nil {
			ids[a.TransferId] = true
		}
	}
	return ids, nil
}

// failedRestore reports whether the workspace was restored from a
// Transfer and never ran: deleting it keeps the restored Volume, whatever
// its binding says (the seed's rule for a failed RestoreWorkspace).
func (r *record) failedRestore() bool {
	return r.book.Restore != nil && r.ws.Generation == 0
}

// notExporting refuses a change of a workspace that a Transfer is
// exporting: its host reads the layer meanwhile.
func (s *Service) notExporting(ctx context.Context, tx store.Tx, r *record) error {
	if s.Exporting == nil || r.row.HostID == "" {
		return nil
	}
	transfer, err := s.Exporting(ctx, tx, r.row.ProjectID, r.row.ID, r.row.HostID)
	if err != nil || transfer == "" {
		return err
	}
	return precondition(observed(ctx, tx, r), "workspace %s is being exported by transfer %s; wait until it is COMPLETE or FAILED", r.row.ID, transfer)
}
