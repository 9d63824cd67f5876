package sdk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/sdk/chunked"
)

// transferPoll is how often a Transfer in progress is read again.
const transferPoll = 250 * time.Millisecond

// Export exports the Workspace, which must be STOPPED, waits until the
// artifact is COMPLETE, and writes it to w, checked against its digest.
// It returns the Transfer, whose manifest describes the artifact.
func (w *Workspace) Export(ctx context.Context, out io.Writer) (*ctrlv1.Transfer, error) {
	return w.export(ctx, out, false)
}

// ExportWithTemplate is Export with the Template revision's image carried
// in the artifact, so that a deployment lacking that revision restores
// it.
func (w *Workspace) ExportWithTemplate(ctx context.Context, out io.Writer) (*ctrlv1.Transfer, error) {
	return w.export(ctx, out, true)
}

func (w *Workspace) export(ctx context.Context, out io.Writer, withTemplate bool) (*ctrlv1.Transfer, error) {
	c := w.c
	resp, err := c.transfers().ExportWorkspace(ctx, connect.NewRequest(&ctrlv1.ExportWorkspaceRequest{Command: commandMetadata(""),
		WorkspaceId: w.id, WithTemplate: withTemplate}))
	if err != nil {
		return nil, err
	}
	t, err := c.awaitTransfer(ctx, resp.Msg.GetTransfer())
	if err != nil {
		return t, err
	}
	stream, err := c.transfers().ReadTransferArtifact(ctx, connect.NewRequest(&ctrlv1.ReadTransferArtifactRequest{TransferId: t.GetTransferId()}))
	if err != nil {
		return t, err
	}
	defer stream.Close()
	h := sha256.New()
	dst := io.MultiWriter(out, h)
	for stream.Receive() {
		if _, err := dst.Write(stream.Msg().GetData()); err != nil {
			return t, err
		}
	}
	if err := stream.Err(); err != nil {
		return t, err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != t.GetManifest().GetDigest() {
		return t, fmt.Errorf("sdk: downloaded artifact is %s, not the transfer's %s", got, t.GetManifest().GetDigest())
	}
	return t, nil
}

// ImportTransfer uploads an artifact Export wrote, read from r (twice:
// once for its digest, then to send it), and returns the Transfer,
// IMPORTED; a truncated, corrupted or foreign artifact is an error
// carrying the FAILED Transfer's message.
func (c *Client) ImportTransfer(ctx context.Context, r io.ReadSeeker) (*ctrlv1.Transfer, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return nil, err
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	stream := c.transfers().ImportTransfer(ctx)
	err := stream.Send(&ctrlv1.ImportTransferRequest{Command: commandMetadata(""), Digest: "sha256:" + hex.EncodeToString(h.Sum(nil))})
	if err == nil {
		var rerr error
		if _, rerr, err = chunked.Send(r, ChunkSize, func(chunk []byte) error {
			return stream.Send(&ctrlv1.ImportTransferRequest{Data: chunk})
		}); rerr != nil {
			return nil, rerr
		}
	}
	resp, err := chunked.Receive(stream, err)
	if err != nil {
		return nil, err
	}
	t := resp.GetTransfer()
	if f := t.GetFailure(); f != nil {
		return t, fmt.Errorf("sdk: transfer %s FAILED: %s", t.GetTransferId(), f.GetMessage())
	}
	if t.GetState() != ctrlv1.TransferState_TRANSFER_STATE_IMPORTED {
		// Deleted while its bytes were on the way.
		return t, fmt.Errorf("sdk: transfer %s is %s, not IMPORTED", t.GetTransferId(), t.GetState())
	}
	return t, nil
}

// Restore creates a new Workspace from a COMPLETE or IMPORTED Transfer and
// waits until it is AVAILABLE.
func (c *Client) Restore(ctx context.Context, transferID string) (*Workspace, error) {
	resp, err := c.transfers().RestoreWorkspace(ctx, connect.NewRequest(&ctrlv1.RestoreWorkspaceRequest{Command: commandMetadata(""), TransferId: transferID}))
	if err != nil {
		return nil, err
	}
	if _, err := c.awaitTransfer(ctx, resp.Msg.GetTransfer()); err != nil {
		return nil, err
	}
	return c.awaitHandle(ctx, resp.Msg.GetWorkspace(), untilAvailable)
}

// awaitTransfer reads a Transfer until its work ends; FAILED is an error.
func (c *Client) awaitTransfer(ctx context.Context, t *ctrlv1.Transfer) (*ctrlv1.Transfer, error) {
	for {
		switch t.GetState() {
		case ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, ctrlv1.TransferState_TRANSFER_STATE_IMPORTING,
			ctrlv1.TransferState_TRANSFER_STATE_RESTORING:
		case ctrlv1.TransferState_TRANSFER_STATE_FAILED:
			return t, fmt.Errorf("sdk: transfer %s FAILED: %s", t.GetTransferId(), t.GetFailure().GetMessage())
		default:
			return t, nil
		}
		select {
		case <-ctx.Done():
			return t, ctx.Err()
		case <-time.After(transferPoll):
		}
		resp, err := c.transfers().GetTransfer(ctx, connect.NewRequest(&ctrlv1.GetTransferRequest{TransferId: t.GetTransferId()}))
		switch {
		case connect.CodeOf(err) == connect.CodeUnavailable:
			// The control plane restarts, or its database is away a
			// moment: the Transfer goes on meanwhile, so the poll does.
			continue
		case err != nil:
			return t, err
		}
		t = resp.Msg.GetTransfer()
	}
}
