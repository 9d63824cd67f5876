// The stored format of templates, which workspace creation reads: the
// built-in project, each revision's row, and the image a host runs.

package templates

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/guestabi"
)

// BuiltinProject is the project that holds the deployment's built-in
// templates, which every project can use.
const BuiltinProject = ""

// DefaultTemplate is the built-in template of every deployment, which a
// workspace created without a template runs.
const DefaultTemplate = "base"

// Image is the template revision a workspace runs, as hosts need it.
type Image struct {
	TemplateID string   `json:"template_id"`
	Revision   string   `json:"revision"`
	Digest     string   `json:"digest"`
	Layers     []Layer  `json:"layers"`
	Env        []string `json:"env,omitempty"`
	// Display is the screen the revision's workspaces carry; nil for none.
	Display *guestabi.DisplaySize `json:"display,omitempty"`
}

// Layer is one compressed layer blob of an Image.
type Layer struct {
	Digest string `json:"digest"`
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"`
}

// StoredRevision is the body of a stored template revision: the API view
// and the image a host runs.
type StoredRevision struct {
	Revision []byte `json:"revision"` // ctrlv1.TemplateRevision
	Image    Image  `json:"image"`
}

// DecodeRevision reads a stored template revision.
func DecodeRevision(r store.TemplateRevision) (*ctrlv1.TemplateRevision, Image, error) {
	var body StoredRevision
	if err := json.Unmarshal(r.Body, &body); err != nil {
		return nil, Image{}, fmt.Errorf("template %s revision %s: %w", r.TemplateID, r.Revision, err)
	}
	rev := new(ctrlv1.TemplateRevision)
	if err := proto.Unmarshal(body.Revision, rev); err != nil {
		return nil, Image{}, err
	}
	return rev, body.Image, nil
}

// EncodeRevision serializes a template revision for the store.
func EncodeRevision(rev *ctrlv1.TemplateRevision, img Image) ([]byte, error) {
	b, err := proto.Marshal(rev)
	if err != nil {
		return nil, err
	}
	return json.Marshal(StoredRevision{Revision: b, Image: img})
}

// FindTemplate returns a live template of the project, or the built-in
// one with that ID, and the project it belongs to.
func FindTemplate(ctx context.Context, tx store.Tx, projectID, id string) (store.Object, error) {
	for _, p := range []string{projectID, BuiltinProject} {
		o, err := tx.Object(ctx, store.KindTemplate, p, id)
		if err == nil && !o.Deleted() {
			return o, nil
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return store.Object{}, err
		}
	}
	return store.Object{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("template %q not found", id))
}

// Resolve turns a selector into the exact revision it names now, and the
// image of that revision. An empty template_id selects DefaultTemplate, an
// empty revision the template's default.
func Resolve(ctx context.Context, tx store.Tx, projectID string, sel *ctrlv1.TemplateSelector) (*ctrlv1.TemplateRef, Image, error) {
	id := sel.GetTemplateId()
	if id == "" {
		id = DefaultTemplate
	}
	o, err := FindTemplate(ctx, tx, projectID, id)
	if err != nil {
		return nil, Image{}, err
	}
	spec := new(ctrlv1.Template)
	if err := proto.Unmarshal(o.Spec, spec); err != nil {
		return nil, Image{}, err
	}
	revision := sel.GetRevision()
	if revision == "" {
		if revision = spec.DefaultRevision; revision == "" {
			return nil, Image{}, connect.NewError(connect.CodeFailedPrecondition,
				fmt.Errorf("template %q has no revision yet: import one first", id))
		}
	}
	// Only revisions the template lists now count: rows of a deleted
	// template of the same ID stay in the store.
	if !slices.ContainsFunc(spec.Revisions, func(r *ctrlv1.TemplateRevision) bool { return r.Revision == revision }) {
		return nil, Image{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("template %q has no revision %q", id, revision))
	}
	revs, err := tx.TemplateRevisions(ctx, o.ProjectID, id)
	if err != nil {
		return nil, Image{}, err
	}
	for _, r := range revs {
		if r.Revision == revision {
			_, img, err := DecodeRevision(r)
			return &ctrlv1.TemplateRef{TemplateId: id, Revision: revision}, img, err
		}
	}
	return nil, Image{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("template %q has no revision %q", id, revision))
}

// FindByDigest returns a live revision, of a template of the project or
// a built-in one, whose image manifest digest is digest; the template ID
// preferred is looked at first. found is false when no template has it.
func FindByDigest(ctx context.Context, tx store.Tx, projectID, preferred, digest string) (ref *ctrlv1.TemplateRef, found bool, err error) {
	var candidates []store.Object
	if o, err := FindTemplate(ctx, tx, projectID, preferred); err == nil {
		candidates = append(candidates, o)
	}
	for _, p := range []string{projectID, BuiltinProject} {
		for after := ""; ; {
			page, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindTemplate, ProjectID: p, After: after, Limit: 100})
			if err != nil {
				return nil, false, err
			}
			candidates = append(candidates, page...)
			if len(page) < 100 {
				break
			}
			after = page[len(page)-1].ID
		}
	}
	for _, o := range candidates {
		spec := new(ctrlv1.Template)
		if err := proto.Unmarshal(o.Spec, spec); err != nil {
			return nil, false, err
		}
		revs, err := tx.TemplateRevisions(ctx, o.ProjectID, o.ID)
		if err != nil {
			return nil, false, err
		}
		for _, r := range revs {
			if !slices.ContainsFunc(spec.Revisions, func(l *ctrlv1.TemplateRevision) bool { return l.Revision == r.Revision }) {
				continue // a row of a deleted template of the same ID
			}
			if _, img, err := DecodeRevision(r); err != nil {
				return nil, false, err
			} else if img.Digest == digest {
				return &ctrlv1.TemplateRef{TemplateId: o.ID, Revision: r.Revision}, true, nil
			}
		}
	}
	return nil, false, nil
}
