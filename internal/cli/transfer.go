package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk/chunked"
)

type transferClient = ctrlv1connect.TransferServiceClient

// transferPoll is how often a Transfer in progress is read again.
const transferPoll = 250 * time.Millisecond

func transferCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "transfer",
		Short: "Manage Transfers: Workspaces exported as artifacts, imported, and restored",
	}
	c := addConnFlags(cmd)
	cmd.AddCommand(
		transferImportCommand(c),
		transferRestoreCommand(c),
		transferDownloadCommand(c),
		transfers.getCommand(c),
		transfers.listCommand(c),
		transferDeleteCommand(c),
	)
	return cmd
}

var transferTable = table[*ctrlv1.Transfer]{
	header: []string{"ID", "STATE", "WORKSPACE", "RESTORED", "SIZE", "TEMPLATE", "LABELS", "EXPIRES"},
	row: func(t *ctrlv1.Transfer) []string {
		state := enumName(t.GetState(), "TRANSFER_STATE_")
		if f := t.GetFailure(); f != nil {
			state += "(" + enumName(f.GetStage(), "FAILURE_STAGE_") + ")"
		}
		size := "-"
		if n := t.GetManifest().GetSizeBytes(); n > 0 {
			size = approxSize(n)
		}
		return []string{t.GetTransferId(), state, orDash(t.GetSourceWorkspaceId()), orDash(t.GetRestoredWorkspaceId()), size,
			templateRef(t.GetManifest().GetTemplate()), pairs(t.GetLabels()), timestamp(t.GetExpiresAt())}
	},
}

var transfers = kind[transferClient, *ctrlv1.TransferManifest, *ctrlv1.Transfer]{
	name:      "transfer",
	plural:    "transfers",
	newClient: ctrlv1connect.NewTransferServiceClient,
	table:     transferTable,
	get: func(ctx context.Context, cl transferClient, id string) (proto.Message, *ctrlv1.Transfer, error) {
		return carrying(ctx, cl.GetTransfer, &ctrlv1.GetTransferRequest{TransferId: id}, (*ctrlv1.GetTransferResponse).GetTransfer)
	},
	list: func(ctx context.Context, cl transferClient, q listQuery) ([]*ctrlv1.Transfer, string, error) {
		return listed(ctx, cl.ListTransfers, &ctrlv1.ListTransfersRequest{PageSize: q.pageSize, PageToken: q.pageToken, LabelSelector: q.selector}, (*ctrlv1.ListTransfersResponse).GetTransfers)
	},
	listResponse: func(items []*ctrlv1.Transfer, next string) proto.Message {
		return &ctrlv1.ListTransfersResponse{Transfers: items, NextPageToken: next}
	},
}

// wsExportCommand is `ws export WS -o FILE`.
func wsExportCommand(c *conn) *cobra.Command {
	var (
		file         string
		withTemplate bool
		meta         metaFlags
	)
	cmd := &cobra.Command{
		Use:   "export WS -o FILE [--with-template] [--label k=v]",
		Short: "Export a STOPPED Workspace (its writable layer and Volume) and download the artifact to FILE",
		Long: "Export a STOPPED Workspace: its host writes the writable layer's files, the Volume's files\n" +
			"and a manifest into one artifact in the deployment's blob store (a progress bar shows it on a\n" +
			"terminal), then the artifact is downloaded to FILE and checked against its digest. Carry FILE\n" +
			"to any deployment and `kibotos transfer import FILE` there; `kibotos transfer restore` makes a\n" +
			"new Workspace of it. The Transfer stays in this deployment until it expires or is deleted.\n" +
			"The restoring deployment needs the Workspace's Template revision (found by image digest);\n" +
			"--with-template carries its image in the artifact too, so that a deployment lacking it\n" +
			"imports it as a Template revision when it restores.",
		Args: cobra.ExactArgs(1),
	}
	// -o names the file here, in place of the output format of other verbs.
	artifactFileFlag(cmd, &file)
	cmd.Flags().BoolVar(&withTemplate, "with-template", false, "carry the Template revision's image in the artifact")
	meta.register(cmd)
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		labels, annotations, err := meta.parse()
		if err != nil {
			return err
		}
		// Where the artifact goes is checked before the host does the work.
		part, cl, done, err := artifactDestination(cmd, c, file)
		if err != nil {
			return err
		}
		defer done()
		resp, err := call(cmd.Context(), cl.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: c.command(cmd, *commandID),
			WorkspaceId: args[0], Labels: labels, Annotations: annotations, WithTemplate: withTemplate})
		if err != nil {
			return err
		}
		out := newStatusLine(cmd.ErrOrStderr())
		t, err := followTransfer(cmd.Context(), cl, resp.GetTransfer(), "exporting", out)
		if err != nil {
			return err
		}
		if err := downloadArtifact(cmd.Context(), cl, t, part, out); err != nil {
			return fmt.Errorf("%w; the artifact stays in transfer %s: `kibotos transfer download %s -o FILE` fetches it again",
				err, t.GetTransferId(), t.GetTransferId())
		}
		return show(cmd, c, &ctrlv1.GetTransferResponse{Transfer: t}, transferTable, t)
	}
	return cmd
}

// followTransfer reads a Transfer until its work ends, drawing its
// progress; a FAILED one is an error. The control plane unavailable (a
// restart) is waited out for up to transferOutage: the work goes on in
// the deployment meanwhile, and the command is not to be run again. An
// error that ends the following names the Transfer.
func followTransfer(ctx context.Context, cl transferClient, t *ctrlv1.Transfer, verb string, out *statusLine) (*ctrlv1.Transfer, error) {
	defer out.end()
	var unavailableSince time.Time
	for {
		switch t.GetState() {
		case ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, ctrlv1.TransferState_TRANSFER_STATE_IMPORTING,
			ctrlv1.TransferState_TRANSFER_STATE_RESTORING, ctrlv1.TransferState_TRANSFER_STATE_DELETING:
		case ctrlv1.TransferState_TRANSFER_STATE_FAILED:
			f := t.GetFailure()
			return t, fmt.Errorf("transfer %s FAILED at %s: %s", t.GetTransferId(), enumName(f.GetStage(), "FAILURE_STAGE_"), f.GetMessage())
		default:
			return t, nil
		}
		if p := t.GetProgress(); p != nil && p.GetBytesTotal() > 0 {
			out.update(progressBar(verb, p.GetBytesDone(), p.GetBytesTotal()))
		}
		select {
		case <-ctx.Done():
			return t, stoppedFollowing(t)
		case <-time.After(transferPoll):
		}
		resp, err := call(ctx, cl.GetTransfer, &ctrlv1.GetTransferRequest{TransferId: t.GetTransferId()})
		if ctx.Err() != nil {
			return t, stoppedFollowing(t)
		}
		if connect.CodeOf(err) == connect.CodeUnavailable {
			if unavailableSince.IsZero() {
				unavailableSince = time.Now()
			}
			if time.Since(unavailableSince) < transferOutage {
				out.update(fmt.Sprintf("%s: the control plane is unavailable; asking again", verb))
				continue
			}
		}
		if err != nil {
			id := t.GetTransferId()
			return t, fmt.Errorf("%w (following transfer %s, whose work may go on in the deployment: `kibotos transfer get %s`)", err, id, id)
		}
		unavailableSince = time.Time{}
		t = resp.GetTransfer()
	}
}

// transferOutage is how long followTransfer waits out a control plane
// that is unavailable.
const transferOutage = 2 * time.Minute

// partFile is the temporary file beside file that an artifact is
// downloaded into, renamed over file once whole.
type partFile struct {
	*os.File
	target string
}

// artifactDestination makes the part file of file (the -o of a verb that
// writes an artifact) and dials the TransferService to fill it; done
// releases both.
func artifactDestination(cmd *cobra.Command, c *conn, file string) (*partFile, transferClient, func(), error) {
	part, err := newPartFile(file)
	if err != nil {
		return nil, nil, nil, err
	}
	cl, closeIdle, err := dialStreaming(cmd, c, ctrlv1connect.NewTransferServiceClient)
	if err != nil {
		part.discard()
		return nil, nil, nil, err
	}
	return part, cl, func() { closeIdle(); part.discard() }, nil
}

// artifactFileFlag registers -o FILE, the file an artifact is written to.
func artifactFileFlag(cmd *cobra.Command, file *string) {
	cmd.Flags().StringVarP(file, "output", "o", "", "the file to write the artifact to (required)")
}

// newPartFile makes the part file of file.
func newPartFile(file string) (*partFile, error) {
	if file == "" {
		return nil, errors.New("-o FILE is required: the file to write the artifact to")
	}
	f, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".part-*")
	if err != nil {
		return nil, fmt.Errorf("cannot write the artifact beside %s: %w", file, err)
	}
	return &partFile{File: f, target: file}, nil
}

// discard removes the temporary file unless it was renamed into place.
func (p *partFile) discard() {
	p.Close()
	os.Remove(p.Name())
}

// downloadArtifact writes a Transfer's artifact to part and renames it
// into place once its digest matched.
func downloadArtifact(ctx context.Context, cl transferClient, t *ctrlv1.Transfer, part *partFile, out *statusLine) error {
	tmp := part.File
	stream, err := cl.ReadTransferArtifact(ctx, connect.NewRequest(&ctrlv1.ReadTransferArtifactRequest{TransferId: t.GetTransferId()}))
	if err != nil {
		return err
	}
	defer stream.Close()
	h := sha256.New()
	var n uint64
	for stream.Receive() {
		data := stream.Msg().GetData()
		if _, err := tmp.Write(data); err != nil {
			return err
		}
		h.Write(data)
		n += uint64(len(data))
		if out.tty {
			out.update(progressBar("downloading", n, stream.Msg().GetTotalBytes()))
		}
	}
	out.end()
	if err := stream.Err(); err != nil {
		return err
	}
	m := t.GetManifest()
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != m.GetDigest() || n != m.GetSizeBytes() {
		return fmt.Errorf("downloaded %d bytes %s; the transfer's artifact is %d bytes %s", n, got, m.GetSizeBytes(), m.GetDigest())
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), part.target)
}

// transferDownloadCommand is `transfer download TRANSFER_ID -o FILE`.
func transferDownloadCommand(c *conn) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "download TRANSFER_ID -o FILE",
		Short: "Download the artifact of a COMPLETE or IMPORTED Transfer to FILE",
		Long: "Download the artifact of a COMPLETE or IMPORTED Transfer to FILE, checked against its digest\n" +
			"(written beside FILE and renamed into place once whole): again after `ws export` could not\n" +
			"write it, or once more for another deployment.",
		Args: cobra.ExactArgs(1),
	}
	artifactFileFlag(cmd, &file)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		part, cl, done, err := artifactDestination(cmd, c, file)
		if err != nil {
			return err
		}
		defer done()
		resp, err := call(cmd.Context(), cl.GetTransfer, &ctrlv1.GetTransferRequest{TransferId: args[0]})
		if err != nil {
			return err
		}
		t := resp.GetTransfer()
		if err := downloadArtifact(cmd.Context(), cl, t, part, newStatusLine(cmd.ErrOrStderr())); err != nil {
			return err
		}
		return show(cmd, c, resp, transferTable, t)
	}
	return cmd
}

func transferImportCommand(c *conn) *cobra.Command {
	var meta metaFlags
	cmd := &cobra.Command{
		Use:   "import FILE [--label k=v]",
		Short: "Upload an artifact `ws export` wrote; the Transfer is IMPORTED once every checksum verified",
		Long: "Upload an artifact (a progress bar shows it on a terminal). The server verifies its digest and\n" +
			"every checksum inside it as it arrives: the Transfer is IMPORTED, or FAILED with what was wrong\n" +
			"(and the command fails) for a truncated, corrupted or foreign file, of which nothing is kept.",
		Args: cobra.ExactArgs(1),
	}
	meta.register(cmd)
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		labels, annotations, err := meta.parse()
		if err != nil {
			return err
		}
		f, st, err := openFile(cmd.Context(), args[0])
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		cl, closeIdle, err := dialStreaming(cmd, c, ctrlv1connect.NewTransferServiceClient)
		if err != nil {
			return err
		}
		defer closeIdle()
		out := newStatusLine(cmd.ErrOrStderr())
		stream := cl.ImportTransfer(cmd.Context())
		err = stream.Send(&ctrlv1.ImportTransferRequest{Command: c.command(cmd, *commandID), Labels: labels, Annotations: annotations,
			Digest: "sha256:" + hex.EncodeToString(h.Sum(nil))})
		if err == nil {
			var rerr error
			sent := int64(0)
			if _, rerr, err = chunked.Send(f, chunkSize, func(chunk []byte) error {
				err := stream.Send(&ctrlv1.ImportTransferRequest{Data: chunk})
				sent += int64(len(chunk))
				if out.tty {
					out.update(progressBar("uploading", uint64(sent), uint64(st.Size())))
				}
				return err
			}); rerr != nil {
				return rerr
			}
		}
		out.end()
		resp, err := chunked.Receive(stream, err)
		if err != nil {
			return err
		}
		t := resp.GetTransfer()
		if err := show(cmd, c, resp, transferTable, t); err != nil {
			return err
		}
		if f := t.GetFailure(); f != nil {
			return fmt.Errorf("transfer %s FAILED: %s", t.GetTransferId(), f.GetMessage())
		}
		if t.GetState() != ctrlv1.TransferState_TRANSFER_STATE_IMPORTED {
			return fmt.Errorf("transfer %s is %s, not IMPORTED: it was deleted before its upload ended", t.GetTransferId(), enumName(t.GetState(), "TRANSFER_STATE_"))
		}
		return nil
	}
	return cmd
}

func transferRestoreCommand(c *conn) *cobra.Command {
	var (
		meta metaFlags
		wait bool
	)
	cmd := &cobra.Command{
		Use:   "restore TRANSFER_ID [--label k=v] [--wait]",
		Short: "Create a new Workspace from a COMPLETE or IMPORTED Transfer",
		Long: "Create a new Workspace (new ID, generation 1) with the exported resources, network policy (its\n" +
			"Egresses and Resolvers are not carried), writable layer and, as a new Volume, the exported\n" +
			"Volume. The Template revision must exist here with the same image digest. --wait follows the\n" +
			"restore with a progress bar until the Workspace is AVAILABLE.",
		Args: cobra.ExactArgs(1),
	}
	meta.register(cmd)
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the restored Workspace is AVAILABLE")
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		labels, annotations, err := meta.parse()
		if err != nil {
			return err
		}
		cl, err := dial(cmd, c, ctrlv1connect.NewTransferServiceClient)
		if err != nil {
			return err
		}
		resp, err := call(cmd.Context(), cl.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: c.command(cmd, *commandID),
			TransferId: args[0], Labels: labels, Annotations: annotations})
		if err != nil {
			return err
		}
		ws := resp.GetWorkspace()
		if wait {
			if _, err := followTransfer(cmd.Context(), cl, resp.GetTransfer(), "restoring", newStatusLine(cmd.ErrOrStderr())); err != nil {
				return err
			}
			wcl, err := dial(cmd, c, ctrlv1connect.NewWorkspaceServiceClient)
			if err != nil {
				return err
			}
			got, err := call(cmd.Context(), wcl.GetWorkspace, &ctrlv1.GetWorkspaceRequest{WorkspaceId: ws.GetWorkspaceId()})
			if err != nil {
				return err
			}
			ws = got.GetWorkspace()
		}
		return show(cmd, c, resp, workspaceTable, ws)
	}
	return cmd
}

func transferDeleteCommand(c *conn) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete TRANSFER_ID",
		Short: "Delete a Transfer and its artifact",
		Args:  cobra.ExactArgs(1),
	}
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := dial(cmd, c, ctrlv1connect.NewTransferServiceClient)
		if err != nil {
			return err
		}
		resp, err := call(cmd.Context(), cl.DeleteTransfer, &ctrlv1.DeleteTransferRequest{Command: c.command(cmd, *commandID), TransferId: args[0]})
		if err != nil {
			return err
		}
		return show(cmd, c, resp, transferTable, resp.GetTransfer())
	}
	return cmd
}

// stoppedFollowing is the error of a command interrupted while it
// followed a Transfer, whose work goes on in the deployment.
func stoppedFollowing(t *ctrlv1.Transfer) error {
	id := t.GetTransferId()
	return fmt.Errorf("canceled: stopped following transfer %s, whose work goes on in the deployment (`kibotos transfer get %s`)", id, id)
}
