// Package templatetest seeds a control-plane store with the built-in
// default template, for tests that create workspaces without importing an
// image.
package templatetest

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
)

// Revision is the one revision of the default template PutDefault stores.
const Revision = "sha256-1"

// PutDefault stores, in tx, the built-in default template with the one
// revision Revision, created at now.
func PutDefault(ctx context.Context, tx store.Tx, now time.Time) error {
	spec, err := proto.Marshal(&ctrlv1.Template{DefaultRevision: Revision, Revisions: []*ctrlv1.TemplateRevision{{Revision: Revision}}})
	if err != nil {
		return err
	}
	rev, err := templates.EncodeRevision(&ctrlv1.TemplateRevision{Revision: Revision},
		templates.Image{TemplateID: templates.DefaultTemplate, Revision: Revision})
	if err != nil {
		return err
	}
	if err := tx.CreateObject(ctx, store.Object{Kind: store.KindTemplate, ProjectID: templates.BuiltinProject, ID: templates.DefaultTemplate,
		Spec: spec, Revision: 1, LabelsRevision: 1, AnnotationsRevision: 1, CreatedAt: now, UpdatedAt: now}); err != nil {
		return err
	}
	return tx.PutTemplateRevision(ctx, store.TemplateRevision{ProjectID: templates.BuiltinProject, TemplateID: templates.DefaultTemplate,
		Revision: Revision, Body: rev, CreatedAt: now})
}
