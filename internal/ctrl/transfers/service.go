package transfers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"gocloud.dev/blob"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

// DefaultTTL is how long an artifact is kept when the deployment says
// nothing else.
const DefaultTTL = 7 * 24 * time.Hour

// Service implements the transfer methods over a store and a blob store.
type Service struct {
	Store store.Store
	Pages *pagetoken.Codec
	// Bucket holds the artifacts.
	Bucket     *blob.Bucket
	Workspaces *workspaces.Service
	// Templates holds the image store an export with the Template reads
	// and a restore imports a carried Template into.
	Templates *templates.Service
	// Changes wakes the hosts' assignment streams and the restore fold.
	Changes *changes.Broker
	// TTL is how long an artifact is kept; zero is DefaultTTL.
	TTL time.Duration
	// Now is the clock; nil is time.Now.
	Now resource.Clock
}

// Write describes a write request.
type Write[R proto.Message] = resource.Mutation[R]

func (s *Service) changed() {
	if s.Changes != nil {
		s.Changes.Publish("")
	}
}

func (s *Service) ttl() time.Duration {
	if s.TTL > 0 {
		return s.TTL
	}
	return DefaultTTL
}

func invalid(format string, a ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, a...))
}

func precondition(format string, a ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, a...))
}

// load reads a Transfer of the project, DELETED included; an unknown one
// is not_found.
func load(ctx context.Context, tx store.Tx, projectID, id string) (*Record, error) {
	return resource.Load(ctx, tx.Transfer, decode, "transfer", projectID, id)
}

// loadByID reads a Transfer of any project by its ID, DELETED included;
// an unknown one is store.ErrNotFound.
func loadByID(ctx context.Context, tx store.Tx, id string) (*Record, error) {
	row, err := tx.TransferByID(ctx, id)
	if err != nil {
		return nil, err
	}
	return decode(row)
}

// save stores a record, stamping updated_at.
func (s *Service) save(ctx context.Context, tx store.Tx, r *Record) error {
	now := s.Now.UTC()
	r.T.UpdatedAt = timestamppb.New(now)
	r.Row.UpdatedAt = now
	return resource.Save(ctx, r.encode, tx.UpdateTransfer, &r.Row)
}

// create stores a new Transfer in state.
func (s *Service) create(ctx context.Context, tx store.Tx, projectID string, state ctrlv1.TransferState,
	labels, annotations map[string]string, book Bookkeeping) (*Record, error) {
	now := s.Now.UTC()
	r := &Record{
		T: &ctrlv1.Transfer{TransferId: ids.New("tr"), State: state, CreatedAt: timestamppb.New(now), UpdatedAt: timestamppb.New(now),
			ExpiresAt: timestamppb.New(now.Add(s.ttl())), Labels: labels, Annotations: annotations,
			Progress: &ctrlv1.TransferProgress{UpdatedAt: timestamppb.New(now)}},
		Book: book,
	}
	r.Row = store.Transfer{ProjectID: projectID, ID: r.T.TransferId, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(s.ttl())}
	row, err := r.encode()
	if err != nil {
		return nil, err
	}
	if err := tx.CreateTransfer(ctx, row); err != nil {
		return nil, err
	}
	r.Row = row
	return r, nil
}

// fail makes a Transfer FAILED at stage; it holds no artifact from then
// on (Collect deletes what is left).
func (s *Service) fail(r *Record, reason ctrlv1.FailureReason, stage ctrlv1.FailureStage, message string) {
	r.T.State = ctrlv1.TransferState_TRANSFER_STATE_FAILED
	r.T.Failure = &ctrlv1.TransferFailure{Reason: reason, Stage: stage, Message: message, FailedAt: timestamppb.New(s.Now.UTC())}
	r.T.Progress = nil
	r.Book.Export, r.Book.Stored = nil, false
	r.Row.HostID, r.Row.ExpiresAt = "", time.Time{}
}

// Export starts the export of a STOPPED workspace: the Transfer is
// EXPORTING and assigned to the host that keeps the layer.
func Export[R proto.Message](ctx context.Context, s *Service, w Write[R], workspaceID string, labels, annotations map[string]string,
	withTemplate bool, respond func(*ctrlv1.Transfer) R) (R, error) {
	var zero R
	if workspaceID == "" {
		return zero, invalid("workspace_id is required")
	}
	if err := resource.CheckMaps(labels, annotations); err != nil {
		return zero, err
	}
	resp, err := resource.Run(ctx, s.Store, w, func(ctx context.Context, tx store.Tx, projectID string) (R, error) {
		src, err := s.Workspaces.ExportSource(ctx, tx, projectID, workspaceID)
		if err != nil {
			return zero, err
		}
		ws := src.Workspace
		m := &ctrlv1.TransferManifest{
			Template: ws.Spec.Template, Resources: ws.Spec.Resources, SourceGeneration: ws.Generation,
			CreatedAt: timestamppb.New(s.Now.UTC()), TemplateImageDigest: src.Image.Digest,
			NetworkPolicy: ws.Spec.NetworkPolicy, CarriesTemplate: withTemplate,
		}
		if src.Volume != nil {
			m.VolumeCapacityBytes, m.VolumeMountPath = src.VolumeBytes, src.Volume.MountPath
		}
		body, err := artifact.EncodeManifest(m)
		if err != nil {
			return zero, err
		}
		exp := &ExportWork{LayerID: src.LayerID, Volume: src.Volume, Manifest: body}
		if withTemplate {
			if exp.TemplateBlobs, err = s.templateBlobs(ctx, src.Image.Digest); err != nil {
				return zero, err
			}
		}
		r, err := s.create(ctx, tx, projectID, ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, labels, annotations,
			Bookkeeping{Export: exp, ReadyState: ctrlv1.TransferState_TRANSFER_STATE_COMPLETE})
		if err != nil {
			return zero, err
		}
		r.T.SourceWorkspaceId, r.T.Manifest = workspaceID, m
		r.Row.HostID = src.HostID
		if err := s.save(ctx, tx, r); err != nil {
			return zero, err
		}
		return respond(r.View()), nil
	})
	if err == nil {
		s.changed()
	}
	return resp, err
}

// templateBlobs lists the blobs of the image digest as an export
// carries them: the image manifest, its config, its layers.
func (s *Service) templateBlobs(ctx context.Context, digest string) ([]string, error) {
	if s.Templates == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("with_template: this deployment keeps no template images"))
	}
	img, err := s.Templates.Image(ctx, digest)
	if err != nil {
		return nil, precondition("with_template: the image %s of the workspace's template revision is not in this deployment's image store: %v", digest, err)
	}
	return img.Blobs(), nil
}

// Exporting returns the Transfer exporting a workspace placed on hostID;
// empty when none is. It is the workspaces service's Exporting hook.
func Exporting(ctx context.Context, tx store.Tx, projectID, workspaceID, hostID string) (string, error) {
	rows, err := tx.HostTransfers(ctx, hostID)
	if err != nil {
		return "", err
	}
	for _, row := range rows {
		r, err := decode(row)
		if err != nil {
			return "", err
		}
		if row.ProjectID == projectID && r.T.State == ctrlv1.TransferState_TRANSFER_STATE_EXPORTING && r.T.SourceWorkspaceId == workspaceID {
			return r.T.TransferId, nil
		}
	}
	return "", nil
}

// Get returns a Transfer, a DELETED one included.
func (s *Service) Get(ctx context.Context, id string) (*ctrlv1.Transfer, error) {
	return resource.Read(ctx, s.Store, "transfer_id", id, load, view)
}

// view presents a Transfer as reads return it.
func view(_ context.Context, _ store.Tx, r *Record) (*ctrlv1.Transfer, error) { return r.View(), nil }

// List returns one page of the Transfers that are not DELETED.
func (s *Service) List(ctx context.Context, pageSize uint32, token string, selector map[string]string) ([]*ctrlv1.Transfer, string, error) {
	return resource.ListPage(ctx, s.Store, s.Pages, "transfer", pageSize, token, selector,
		store.Tx.Transfers,
		func(t store.Transfer) string { return t.ID },
		func(t store.Transfer) int { return len(t.Body) + meta.Bytes(t.Labels) },
		resource.Decoded(decode, view))
}

// Delete deletes a Transfer and its artifact: DELETING until the artifact
// is gone, then DELETED. An export or a restore in progress is refused.
func Delete[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, respond func(*ctrlv1.Transfer) R) (R, error) {
	var deleting string
	resp, changed, err := resource.EditID(ctx, s.Store, w, "transfer_id", id, load, (*Record).encode,
		func(ctx context.Context, tx store.Tx, r *Record) error {
			switch r.T.State {
			case ctrlv1.TransferState_TRANSFER_STATE_DELETING, ctrlv1.TransferState_TRANSFER_STATE_DELETED:
				return nil
			case ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, ctrlv1.TransferState_TRANSFER_STATE_RESTORING:
				return precondition("transfer %s is %s; delete it once that ends", id, StateName(r.T.State))
			}
			r.T.State = ctrlv1.TransferState_TRANSFER_STATE_DELETING
			r.T.Progress = nil
			r.Row.ExpiresAt = time.Time{}
			deleting = r.T.TransferId
			return nil
		},
		s.save, view, respond)
	if changed {
		s.changed()
	}
	if err == nil && deleting != "" {
		// The loop finishes a deletion this call could not.
		if err := s.finishDelete(ctx, deleting); err != nil {
			return resp, nil
		}
	}
	return resp, err
}

// finishDelete removes the artifact of a DELETING Transfer and makes it
// DELETED.
func (s *Service) finishDelete(ctx context.Context, id string) error {
	if err := deleteBlob(ctx, s.Bucket, artifactKey(id)); err != nil {
		return err
	}
	return s.Store.Update(ctx, func(tx store.Tx) error {
		r, err := loadByID(ctx, tx, id)
		if err != nil || r.T.State != ctrlv1.TransferState_TRANSFER_STATE_DELETING {
			return err
		}
		r.T.State = ctrlv1.TransferState_TRANSFER_STATE_DELETED
		r.Book.Stored = false
		r.Row.DeletedAt = s.Now.UTC()
		return s.save(ctx, tx, r)
	})
}
