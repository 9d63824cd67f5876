// Package templates is ctrl's TemplateService: named sets of immutable
// revisions, each one OCI image, that workspaces are created from.
//
// Storage. A Template is a store.Object of store.KindTemplate whose ID is
// the caller-chosen template_id. Its Spec is a serialized ctrlv1.Template
// holding default_revision and revisions (the API view of each revision
// the Template has, oldest first); its Revision is Template.revision, the
// CAS token of the default pointer (1 at creation, +1 whenever
// default_revision changes); labels and annotations are kept as for every
// object. Each revision is also an immutable row of the store's
// template_revisions, encoded with EncodeRevision, from which
// workspace creation resolves the image; the image blobs live in the
// imagestore.Store on disk.
//
// Why the Spec lists the revisions: deleting a Template tombstones its
// object, and creating the ID again revives that row, but the store
// keeps revision rows and an object's created_at until it prunes the
// deleted Template (store.Tx.PruneDeleted). The Spec of a
// revived Template starts empty (with its own created_at), so the rows of
// the earlier incarnation are not its revisions; importing such an image
// again lists its existing row anew.
//
// Built-in templates (such as base) live in project BuiltinProject
// (""). Every project reads and uses them, by their ID, wherever its own
// project has no Template of that ID; only an admin of the operator project
// may change them (other callers get permission_denied), and no project can
// create a Template with a built-in's ID (already_exists).
//
// Every error the Service returns is a *connect.Error with its canonical
// code, or an internal error that the Handler reports as such.
package templates

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/registry"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// DefaultMaxArchiveBytes bounds one uploaded image archive.
const DefaultMaxArchiveBytes int64 = 8 << 30

// Puller pulls an image from a registry: *registry.Puller. Its errors
// wrap registry.ErrNotFound (not_found), registry.ErrDenied
// (permission_denied), registry.ErrRefused (failed_precondition) or
// registry.ErrBadReference (invalid_argument); any other error is taken as
// the registry being unreachable (unavailable), and a *connect.Error
// passes through with its code.
type Puller interface {
	Pull(ctx context.Context, ref string, platform v1.Platform, creds registry.Credentials) (v1.Image, error)
}

// Service implements the TemplateService on a store and an image store.
type Service struct {
	Store  store.Store
	Images *imagestore.Store
	// Shared, when set, puts every imported image's blobs in the
	// deployment's blob store before its revision is recorded, so that
	// every replica can deliver it; its Images is Images.
	Shared *Blobs
	Pages  *pagetoken.Codec
	// Registry pulls images by reference. Nil means this deployment cannot
	// pull, and registry imports are unavailable.
	Registry Puller
	// MaxArchiveBytes bounds one uploaded archive; 0 is
	// DefaultMaxArchiveBytes. A larger upload is resource_exhausted.
	MaxArchiveBytes int64
	// InUse builds the failed_precondition of deleting a Template that a
	// workspace of the caller's project uses, with the workspace attached
	// (workspaces.InUse: workspaces imports templates, so not the
	// reverse). Nil leaves the workspace out.
	InUse func(ctx context.Context, tx store.Tx, projectID, workspaceID, format string, a ...any) error
	// Now is the clock; nil is time.Now.
	Now resource.Clock
}

func (s *Service) maxArchiveBytes() int64 {
	if s.MaxArchiveBytes > 0 {
		return s.MaxArchiveBytes
	}
	return DefaultMaxArchiveBytes
}

func invalid(format string, a ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, a...))
}

func notFound(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("template %q not found", id))
}

func caller(ctx context.Context) (auth.Caller, error) {
	c, ok := auth.CallerFrom(ctx)
	if !ok {
		return auth.Caller{}, connect.NewError(connect.CodeUnauthenticated, auth.ErrUnauthenticated)
	}
	return c, nil
}

// mayChangeBuiltin reports whether c may change built-in templates.
func mayChangeBuiltin(c auth.Caller) bool { return c.Operator && c.Role == auth.Admin }

// ValidateID checks a template_id: a DNS label of lower-case letters,
// digits and '-', 1 to 63 characters, starting with a letter and, as every
// DNS label, not ending with '-'.
func ValidateID(id string) error {
	if id == "" {
		return errors.New("template_id is required")
	}
	if len(id) > 63 {
		return fmt.Errorf("template_id %q is %d characters, more than 63", id, len(id))
	}
	for i, r := range id {
		switch {
		case r >= 'a' && r <= 'z':
		case (r >= '0' && r <= '9' || r == '-') && i > 0:
		default:
			return fmt.Errorf("template_id %q is not a DNS label: use lower-case letters, digits and '-', starting with a letter", id)
		}
	}
	if id[len(id)-1] == '-' {
		return fmt.Errorf("template_id %q is not a DNS label: it must not end with '-'", id)
	}
	return nil
}

// tmpl is one live Template as stored.
type tmpl struct {
	obj  store.Object
	spec *ctrlv1.Template
}

func (t *tmpl) builtin() bool { return t.obj.ProjectID == BuiltinProject }

// find returns the Template's revision of that name.
func (t *tmpl) find(revision string) (*ctrlv1.TemplateRevision, bool) {
	for _, r := range t.spec.GetRevisions() {
		if r.GetRevision() == revision {
			return r, true
		}
	}
	return nil, false
}

// createdAt is when this incarnation of the Template was created.
func (t *tmpl) createdAt() time.Time { return createdAt(t.obj, t.spec) }

func createdAt(o store.Object, spec *ctrlv1.Template) time.Time {
	if spec.GetCreatedAt() != nil {
		return spec.GetCreatedAt().AsTime()
	}
	return o.CreatedAt
}

// view returns the Template as reads return it.
func (t *tmpl) view() *ctrlv1.Template {
	out := &ctrlv1.Template{
		TemplateId:          t.obj.ID,
		DefaultRevision:     t.spec.GetDefaultRevision(),
		Revisions:           cloneAll(t.spec.GetRevisions()),
		Revision:            t.obj.Revision,
		CreatedAt:           timestamppb.New(t.createdAt()),
		UpdatedAt:           timestamppb.New(t.obj.UpdatedAt),
		Labels:              t.obj.Labels,
		Annotations:         t.obj.Annotations,
		LabelsRevision:      t.obj.LabelsRevision,
		AnnotationsRevision: t.obj.AnnotationsRevision,
	}
	return out
}

func cloneAll(revs []*ctrlv1.TemplateRevision) []*ctrlv1.TemplateRevision {
	out := make([]*ctrlv1.TemplateRevision, 0, len(revs))
	for _, r := range revs {
		out = append(out, proto.CloneOf(r))
	}
	return out
}

// encode returns the object with its spec as the store keeps it.
func (t *tmpl) encode() (store.Object, error) {
	o := t.obj
	var err error
	o.Spec, err = proto.MarshalOptions{Deterministic: true}.Marshal(t.spec)
	return o, err
}

// save stores the object with its spec.
func (t *tmpl) save(ctx context.Context, tx store.Tx) error {
	o, err := t.encode()
	if err != nil {
		return err
	}
	t.obj = o
	return tx.UpdateObject(ctx, t.obj)
}

// lookup returns the live Template id as c sees it: its own project's, or
// else the built-in one. For a write (write set) to a built-in Template by
// anyone but an operator admin it is permission_denied; unknown, deleted
// and other projects' Templates are not_found.
func lookup(ctx context.Context, tx store.Tx, c auth.Caller, id string, write bool) (*tmpl, error) {
	if id == "" {
		return nil, invalid("template_id is required")
	}
	for _, p := range []string{c.ProjectID, BuiltinProject} {
		o, err := tx.Object(ctx, store.KindTemplate, p, id)
		if errors.Is(err, store.ErrNotFound) || err == nil && o.Deleted() {
			continue
		}
		if err != nil {
			return nil, err
		}
		if write && p == BuiltinProject && p != c.ProjectID && !mayChangeBuiltin(c) {
			return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf(
				"template %q is built in: only an admin of the operator project may change it", id))
		}
		return load(o)
	}
	return nil, notFound(id)
}

// load decodes a live template object.
func load(o store.Object) (*tmpl, error) {
	spec := new(ctrlv1.Template)
	if err := proto.Unmarshal(o.Spec, spec); err != nil {
		return nil, fmt.Errorf("template %s: stored spec: %w", o.ID, err)
	}
	return &tmpl{obj: o, spec: spec}, nil
}
