package transfers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/sdk/chunked"
)

// progressEvery bounds how often progress is stored while bytes stream.
const progressEvery = time.Second

// digestPattern is sha256:<hex>.
var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func progress(done, total uint64, now time.Time) *ctrlv1.TransferProgress {
	return &ctrlv1.TransferProgress{BytesDone: done, BytesTotal: total, UpdatedAt: timestamppb.New(now)}
}

// ImportMethod is the procedure of ImportTransfer, the command's method.
const ImportMethod = "/kibotos.ctrl.v1.TransferService/ImportTransfer"

// Import receives an artifact: the Transfer is IMPORTING while the bytes
// arrive and are verified, then IMPORTED, or FAILED with what was wrong
// and nothing stored. recv returns the next message, io.EOF at the end.
// A command already run answers with its first result (the upload is not
// read).
func (s *Service) Import(ctx context.Context, recv func() (*ctrlv1.ImportTransferRequest, error)) (*ctrlv1.ImportTransferResponse, error) {
	first, err := recv()
	if errors.Is(err, io.EOF) {
		return nil, invalid("the upload is empty: the first message names command and digest")
	}
	if err != nil {
		return nil, err
	}
	input := proto.CloneOf(first)
	input.Data = nil
	if !digestPattern.MatchString(first.Digest) {
		return nil, invalid("digest %q must be sha256:<64 lowercase hex digits>", first.Digest)
	}
	if err := resource.CheckMaps(first.Labels, first.Annotations); err != nil {
		return nil, err
	}
	cmd, err := resource.CommandOf(ctx, resource.Mutation[*ctrlv1.ImportTransferResponse]{Method: ImportMethod,
		Command: first.Command, Input: input, New: resource.NewMessage[*ctrlv1.ImportTransferResponse]})
	if err != nil {
		return nil, err
	}
	if resp, found, err := command.Replay(ctx, s.Store, cmd); err != nil || found {
		return resp, err
	}
	var r *Record
	err = s.Store.Update(ctx, func(tx store.Tx) error {
		r, err = s.create(ctx, tx, cmd.ProjectID, ctrlv1.TransferState_TRANSFER_STATE_IMPORTING, first.Labels, first.Annotations,
			Bookkeeping{ReadyState: ctrlv1.TransferState_TRANSFER_STATE_IMPORTED})
		return err
	})
	if err != nil {
		return nil, err
	}
	s.changed()
	id := r.T.TransferId
	src := &uploadReader{pending: first.Data, recv: func() ([]byte, error) {
		m, err := recv()
		return m.GetData(), err
	}}
	last := time.Now()
	rec, err := receive(ctx, s.Bucket, id, src, func(n uint64) {
		if time.Since(last) >= progressEvery {
			last = time.Now()
			s.setProgress(context.WithoutCancel(ctx), id, n, 0)
		}
	})
	if err == nil && rec.digest != first.Digest {
		deleteBlob(ctx, s.Bucket, rec.staged)
		err = fmt.Errorf("%w: its sha256 is %s, not the %s the upload declared", artifact.ErrInvalid, rec.digest, first.Digest)
	}
	if err == nil {
		err = commit(ctx, s.Bucket, id, rec)
	}
	// Once the bytes are in, the outcome is stored even if the caller left.
	ctx = context.WithoutCancel(ctx)
	resp, err := command.Run(ctx, s.Store, cmd, func(ctx context.Context, tx store.Tx) (*ctrlv1.ImportTransferResponse, error) {
		r, lerr := load(ctx, tx, cmd.ProjectID, id)
		if lerr != nil {
			return nil, lerr
		}
		if r.T.State == ctrlv1.TransferState_TRANSFER_STATE_IMPORTING {
			if err != nil {
				s.fail(r, failureReason(err), ctrlv1.FailureStage_FAILURE_STAGE_IMPORTING_TRANSFER, importMessage(err))
			} else {
				m := rec.manifest
				m.SizeBytes, m.Digest = rec.size, rec.digest
				r.T.State, r.T.Manifest, r.T.Progress = ctrlv1.TransferState_TRANSFER_STATE_IMPORTED, m, nil
				r.Book.Stored = true
			}
			if serr := s.save(ctx, tx, r); serr != nil {
				return nil, serr
			}
		}
		return &ctrlv1.ImportTransferResponse{Transfer: r.View()}, nil
	})
	if err != nil || resp.GetTransfer().GetTransferId() != id {
		// The command did not record this call's Transfer: another call of
		// the same command answered first while this one uploaded (the
		// caller gets that answer, or already_exists for a different
		// request), or the outcome could not be stored (the caller sends
		// the command again). The Transfer this call made is no one's.
		s.discard(ctx, id)
	}
	return resp, err
}

// discard deletes the Transfer id and its artifact, at once and for good,
// while it is still IMPORTING; what it cannot remove the transfers loop
// fails and collects.
func (s *Service) discard(ctx context.Context, id string) {
	discarded := false
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		r, err := loadByID(ctx, tx, id)
		if err != nil || r.T.State != ctrlv1.TransferState_TRANSFER_STATE_IMPORTING {
			return err
		}
		r.T.State, r.T.Progress = ctrlv1.TransferState_TRANSFER_STATE_DELETED, nil
		r.Book.Stored = false
		r.Row.ExpiresAt = time.Time{}
		r.Row.DeletedAt = s.Now.UTC()
		discarded = true
		return s.save(ctx, tx, r)
	})
	if err != nil || !discarded {
		return
	}
	s.changed()
	deleteBlob(ctx, s.Bucket, artifactKey(id))
}

// failureReason classifies why an upload failed.
func failureReason(err error) ctrlv1.FailureReason {
	switch {
	case errors.Is(err, artifact.ErrInvalid):
		return ctrlv1.FailureReason_FAILURE_REASON_INVALID_REQUEST
	case errors.Is(err, context.Canceled), connect.CodeOf(err) == connect.CodeCanceled:
		return ctrlv1.FailureReason_FAILURE_REASON_CANCELLED
	}
	return ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE
}

// importMessage says why an import failed.
func importMessage(err error) string {
	if errors.Is(err, artifact.ErrInvalid) {
		return "the uploaded file is not a whole Kibotos transfer artifact: " + err.Error()
	}
	return "the upload ended before the artifact was whole: " + err.Error()
}

// uploadReader reads the data of a client stream's messages.
type uploadReader struct {
	pending []byte
	recv    func() ([]byte, error)
}

func (u *uploadReader) Read(p []byte) (int, error) {
	for len(u.pending) == 0 {
		data, err := u.recv()
		if err != nil {
			return 0, err
		}
		u.pending = data
	}
	n := copy(p, u.pending)
	u.pending = u.pending[n:]
	return n, nil
}

// setProgress records how far the upload of an IMPORTING Transfer came;
// it also tells the loop that the upload is alive. Hosts report the
// progress of their work with Report.
func (s *Service) setProgress(ctx context.Context, id string, done, total uint64) {
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		r, err := loadByID(ctx, tx, id)
		if err != nil || r.T.State != ctrlv1.TransferState_TRANSFER_STATE_IMPORTING {
			return err
		}
		r.T.Progress = progress(done, total, s.Now.UTC())
		return s.save(ctx, tx, r)
	})
	if err == nil {
		s.changed()
	}
}

// Read streams the artifact of a Transfer that holds one, from offset.
func (s *Service) Read(ctx context.Context, id string, offset uint64, send func(data []byte, total uint64) error) error {
	if id == "" {
		return invalid("transfer_id is required")
	}
	c, _ := auth.CallerFrom(ctx)
	err := s.Store.View(ctx, func(tx store.Tx) error {
		r, err := load(ctx, tx, c.ProjectID, id)
		if err != nil {
			return err
		}
		if !readable(r.T.State) {
			return precondition("transfer %s is %s and holds no artifact to read", id, StateName(r.T.State))
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.stream(ctx, id, offset, send)
}

// stream sends the committed artifact of id from offset.
func (s *Service) stream(ctx context.Context, id string, offset uint64, send func(data []byte, total uint64) error) error {
	attrs, err := s.Bucket.Attributes(ctx, artifactKey(id))
	if err != nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("the artifact of transfer %s is not stored", id))
	}
	total := uint64(attrs.Size)
	if offset > total {
		return connect.NewError(connect.CodeOutOfRange, fmt.Errorf("offset %d is past the artifact's %d bytes", offset, total))
	}
	rd, err := s.Bucket.NewRangeReader(ctx, artifactKey(id), int64(offset), -1, nil)
	if err != nil {
		return err
	}
	defer rd.Close()
	_, rerr, serr := chunked.Send(rd, chunked.Size, func(chunk []byte) error { return send(chunk, total) })
	if serr != nil {
		return serr
	}
	return rerr
}
