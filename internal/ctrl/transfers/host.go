package transfers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
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
			LayerId: e.LayerID, Volume: e.Volume, Manifest: e.Manifest})
	}
	return out, nil
}

// Report records the progress a host reports of its exports and restores.
func (s *Service) Report(ctx context.Context, hostID string, reports []*hostv1.TransferReport) {
	for _, rep := range reports {
		if rep.FailureMessage != "" {
			slog.Warn("transfers: an attempt failed on a host, which tries again", "transfer", rep.TransferId, "host", hostID, "err", rep.FailureMessage)
			continue
		}
		s.setProgress(ctx, rep.TransferId, rep.BytesDone, rep.BytesTotal)
	}
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
		row, err := tx.TransferByID(ctx, id)
		if err != nil {
			return err
		}
		r, err := decode(row)
		if err != nil {
			return err
		}
		if r.T.State != ctrlv1.TransferState_TRANSFER_STATE_EXPORTING || row.HostID != hostID {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("transfer %s is not an export assigned to host %s", id, hostID))
		}
		return nil
	}); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("transfer %s does not exist", id))
		}
		return err
	}
	var declared string
	src := &uploadReader{pending: first.Data, recv: func() ([]byte, error) {
		m, err := recv()
		if err == nil && m.Digest != "" {
			declared = m.Digest
		}
		return m.GetData(), err
	}}
	rec, err := receive(ctx, s.Bucket, id, src, nil)
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
		row, err := tx.TransferByID(ctx, id)
		if err != nil {
			return err
		}
		r, err := decode(row)
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
