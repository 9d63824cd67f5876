package transfers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
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

// ExportsBlob reports whether an export assigned to hostID carries the
// template blob digest: the blobs the host fetches to write the template
// into the artifact.
func (s *Service) ExportsBlob(ctx context.Context, hostID, digest string) (bool, error) {
	exports, err := s.HostAssignments(ctx, hostID)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(exports, func(e *hostv1.TransferAssignment) bool { return slices.Contains(e.TemplateBlobs, digest) }), nil
}

// MaxExportAttempts is how many failed attempts of an export make its
// Transfer FAILED.
const MaxExportAttempts = 3

// MaxReports bounds the transfer reports of one ReportExecutions call:
// an agent sends one for each export and restore it works on, a few at a
// time.
const MaxReports = 1024

// CheckReports refuses, as invalid_argument, more transfer reports than
// MaxReports, and reports no host makes: progress past its own total.
func CheckReports(reports []*hostv1.TransferReport) error {
	if len(reports) > MaxReports {
		return invalid("transfers holds %d reports; at most %d are sent at once", len(reports), MaxReports)
	}
	for i, rep := range reports {
		if rep.BytesDone > rep.BytesTotal {
			return invalid("transfers[%d]: bytes_done %d is past bytes_total %d", i, rep.BytesDone, rep.BytesTotal)
		}
	}
	return nil
}

// Report records the progress a host reports of its exports and restores,
// and the failed attempts of its exports, in one write. Reports of
// Transfers the host does not work on (hostWork) are ignored: those of
// work ctrl withdrew since the host saw it, and any other host's; and
// progress a Transfer already shows is not stored again. The reports are
// those CheckReports passed.
func (s *Service) Report(ctx context.Context, hostID string, reports []*hostv1.TransferReport) {
	if len(reports) == 0 {
		return
	}
	saved := false
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		saved = false
		work, err := s.hostWork(ctx, tx, hostID, reports)
		if err != nil {
			return err
		}
		var moved []*Record
		for _, rep := range reports {
			r := work[rep.TransferId]
			if r == nil || !pending(r.T.State) {
				continue // not the host's, or failed by an earlier report
			}
			switch {
			case rep.FailureMessage != "" && r.Book.Export != nil:
				slog.Warn("transfers: an export attempt failed on a host", "transfer", rep.TransferId, "host", hostID,
					"permanent", rep.Permanent, "err", rep.FailureMessage)
				s.exportFailed(r, rep.FailureMessage, rep.Permanent)
			case rep.FailureMessage != "":
				continue // a restore fails with its workspace's execution
			case rep.BytesDone == r.T.Progress.GetBytesDone() && rep.BytesTotal == r.T.Progress.GetBytesTotal():
				continue // nothing new; only an upload's progress tells the loop it is alive
			default:
				r.T.Progress = progress(rep.BytesDone, rep.BytesTotal, s.Now.UTC())
			}
			if !slices.Contains(moved, r) {
				moved = append(moved, r)
			}
		}
		for _, r := range moved {
			if err := s.save(ctx, tx, r); err != nil {
				return err
			}
		}
		saved = len(moved) > 0
		return nil
	})
	if err != nil {
		slog.Warn("transfers: recording a host's transfer reports", "host", hostID, "err", err)
	}
	if saved {
		s.changed()
	}
}

// hostWork returns, by ID, those of the reported Transfers that hostID
// works on: the EXPORTING ones assigned to it, and the RESTORING ones
// that a workspace placed on it restores from.
func (s *Service) hostWork(ctx context.Context, tx store.Tx, hostID string, reports []*hostv1.TransferReport) (map[string]*Record, error) {
	reported := map[string]bool{}
	for _, rep := range reports {
		reported[rep.TransferId] = true
	}
	work := map[string]*Record{}
	rows, err := tx.HostTransfers(ctx, hostID)
	if err != nil {
		return nil, err
	}
	for _, row := range rows {
		if !reported[row.ID] {
			continue
		}
		r, err := decode(row)
		if err != nil {
			return nil, err
		}
		if r.T.State == ctrlv1.TransferState_TRANSFER_STATE_EXPORTING && r.Book.Export != nil {
			work[row.ID] = r
		}
	}
	restoring, err := s.Workspaces.RestoringFrom(ctx, tx, hostID)
	if err != nil {
		return nil, err
	}
	for id := range restoring {
		if !reported[id] || work[id] != nil {
			continue
		}
		r, err := loadByID(ctx, tx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if r.T.State == ctrlv1.TransferState_TRANSFER_STATE_RESTORING {
			work[id] = r
		}
	}
	return work, nil
}

// exportFailed counts a failed attempt of the export r: the Transfer is
// FAILED at stage EXPORTING_WORKSPACE with message once MaxExportAttempts
// failed, or at once when the failure is permanent. The host, no longer
// assigned the export, stops trying.
func (s *Service) exportFailed(r *Record, message string, permanent bool) {
	r.Book.Export.Failures++
	if n := r.Book.Export.Failures; permanent || n >= MaxExportAttempts {
		reason := ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE
		if permanent {
			reason = ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND
		} else {
			message = fmt.Sprintf("%d attempts failed; the last: %s", n, message)
		}
		s.fail(r, reason, ctrlv1.FailureStage_FAILURE_STAGE_EXPORTING_WORKSPACE, message)
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
