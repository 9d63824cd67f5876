package transfers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"

	"connectrpc.com/connect"
	"gocloud.dev/gcerrors"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// This file is the host-facing half: the exports a host is assigned, the
// progress it reports, the artifacts it uploads and downloads.

// HostAssignments returns the exports a host is assigned.
func (s *Service) HostAssignments(ctx context.Context, hostID string) ([]*hostv1.TransferAssignment, error) {
	var rows []store.Transfer
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		rows, err = tx.HostTransfers(ctx, hostID)
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []*hostv1.TransferAssignment
	for _, row := range rows {
		r, err := decode(row)
		if err != nil {
			return nil, err
		}
		if r.T.State != ctrlv1.TransferState_TRANSFER_STATE_EXPORTING || r.Book.Export == nil {
			continue
		}
		e := r.Book.Export
		out = append(out, &hostv1.TransferAssignment{TransferId: r.T.TransferId, WorkspaceId: r.T.SourceWorkspaceId,
			LayerId: e.LayerID, Volume: e.Volume, Manifest: e.Manifest, TemplateBlobs: e.TemplateBlobs})
	}
	return out, nil
}

// MaxExportAttempts is how many failed attempts of an export make its
// Transfer FAILED.
const MaxExportAttempts = 3

// Report records the progress a host reports of its exports and restores,
// and the failed attempts of its exports.
func (s *Service) Report(ctx context.Context, hostID string, reports []*hostv1.TransferReport) {
	for _, rep := range reports {
		if rep.FailureMessage != "" {
			slog.Warn("transfers: an export attempt failed on a host", "transfer", rep.TransferId, "host", hostID,
				"permanent", rep.Permanent, "err", rep.FailureMessage)
			s.exportFailed(ctx, rep.TransferId, hostID, rep.FailureMessage, rep.Permanent)
			continue
		}
		s.setProgress(ctx, rep.TransferId, rep.BytesDone, rep.BytesTotal)
	}
}

// exportFailed counts a failed attempt of the export id on hostID: the
// Transfer is FAILED at stage EXPORTING_WORKSPACE with message once
// MaxExportAttempts failed, or at once when the failure is permanent.
// The host, no longer assigned the export, stops trying.
func (s *Service) exportFailed(ctx context.Context, id, hostID, message string, permanent bool) {
	failed := false
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		r, err := loadByID(ctx, tx, id)
		if err != nil || r.T.State != ctrlv1.TransferState_TRANSFER_STATE_EXPORTING || r.Row.HostID != hostID || r.Book.Export == nil {
			return err
		}
		r.Book.Export.Failures++
		if n := r.Book.Export.Failures; permanent || n >= MaxExportAttempts {
			reason := ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE
			if permanent {
				reason = ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND
			} else {
				message = fmt.Sprintf("%d attempts failed; the last: %s", n, message)
			}
			s.fail(r, reason, ctrlv1.FailureStage_FAILURE_STAGE_EXPORTING_WORKSPACE, message)
			failed = true
		}
		return s.save(ctx, tx, r)
	})
	if err != nil {
		slog.Warn("transfers: recording a failed export attempt", "transfer", id, "err", err)
	}
	if failed {
		s.changed()
	}
}

// failExport makes an EXPORTING Transfer FAILED at once, for an artifact
// that no attempt can make whole.
func (s *Service) failExport(ctx context.Context, id string, reason ctrlv1.FailureReason, message string) error {
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		r, err := loadByID(ctx, tx, id)
		if err != nil || r.T.State != ctrlv1.TransferState_TRANSFER_STATE_EXPORTING {
			return err
		}
		s.fail(r, reason, ctrlv1.FailureStage_FAILURE_STAGE_EXPORTING_WORKSPACE, message)
		return s.save(ctx, tx, r)
	})
	if err == nil {
		s.changed()
	}
	return err
}

// PutArtifact receives the artifact a host exported for an EXPORTING
// Transfer assigned to it: staged, verified as it streams, checked against
// the digest the host computed, committed, and the Transfer COMPLETE.
func (s *Service) PutArtifact(ctx context.Context, recv func() (*hostv1.PutTransferArtifactRequest, error)) error {
	first, err := recv()
	if errors.Is(err, io.EOF) {
		return invalid("the upload is empty: the first message names host_id and transfer_id")
	}
	if err != nil {
		return err
	}
	id, hostID := first.TransferId, first.HostId
	if err := s.Store.View(ctx, func(tx store.Tx) error {
		r, err := loadByID(ctx, tx, id)
		if err != nil {
			return err
		}
		if r.T.State != ctrlv1.TransferState_TRANSFER_STATE_EXPORTING || r.Row.HostID != hostID {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("transfer %s is not an export assigned to host %s", id, hostID))
		}
		return nil
	}); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("transfer %s does not exist", id))
		}
		return err
	}
	var (
		declared string
		ended    bool // the host ended its upload
	)
	src := &uploadReader{pending: first.Data, recv: func() ([]byte, error) {
		m, err := recv()
		if err == nil && m.Digest != "" {
			declared = m.Digest
		}
		ended = errors.Is(err, io.EOF)
		return m.GetData(), err
	}}
	rec, err := receive(ctx, s.Bucket, id, src, nil)
	if err != nil && ended && declared == "" {
		// The host stopped before its digest: its export failed there, and
		// its report says why; what arrived is no artifact to judge.
		return connect.NewError(connect.CodeAborted, fmt.Errorf("artifact of transfer %s: the upload ended before the host's digest", id))
	}
	if errors.Is(err, artifact.ErrInvalid) {
		// What the host wrote does not verify: writing it again would not
		// either.
		msg := "the artifact the host wrote does not verify: " + err.Error()
		if ferr := s.failExport(context.WithoutCancel(ctx), id, ctrlv1.FailureReason_FAILURE_REASON_INVALID_REQUEST, msg); ferr != nil {
			slog.Warn("transfers: failing an export", "transfer", id, "err", ferr)
		}
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("artifact of transfer %s: %w", id, err))
	}
	if noSpace(err) {
		// Trying again would fill the store again.
		msg := "the blob store has no space left for the artifact"
		if ferr := s.failExport(context.WithoutCancel(ctx), id, ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED, msg); ferr != nil {
			slog.Warn("transfers: failing an export", "transfer", id, "err", ferr)
		}
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("artifact of transfer %s: %s", id, msg))
	}
	if err != nil {
		return connect.NewError(connect.CodeDataLoss, fmt.Errorf("artifact of transfer %s: %w", id, err))
	}
	if declared != rec.digest {
		deleteBlob(ctx, s.Bucket, rec.staged)
		return connect.NewError(connect.CodeDataLoss, fmt.Errorf("artifact of transfer %s: received %s, the host sent %q", id, rec.digest, declared))
	}
	if err := commit(ctx, s.Bucket, id, rec); err != nil {
		return err
	}
	err = s.Store.Update(ctx, func(tx store.Tx) error {
		r, err := loadByID(ctx, tx, id)
		if err != nil {
			return err
		}
		if r.T.State != ctrlv1.TransferState_TRANSFER_STATE_EXPORTING {
			return nil // Collect removes the artifact no Transfer holds
		}
		m := r.T.Manifest
		m.SizeBytes, m.Digest = rec.size, rec.digest
		r.T.State, r.T.Progress = ctrlv1.TransferState_TRANSFER_STATE_COMPLETE, nil
		r.Book.Export, r.Book.Stored = nil, true
		r.Row.HostID = ""
		return s.save(ctx, tx, r)
	})
	if err == nil {
		s.changed()
	}
	return err
}

// OpenArtifact streams a committed artifact to a host that restores from
// it, from offset.
func (s *Service) OpenArtifact(ctx context.Context, id string, offset uint64, send func(data []byte, total uint64) error) error {
	return s.stream(ctx, id, offset, send)
}

// noSpace reports whether err is a blob store's refusal for want of space.
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || gcerrors.Code(err) == gcerrors.ResourceExhausted
}
