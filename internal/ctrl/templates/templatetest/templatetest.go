// Package templatetest seeds a control-plane store with the built-in
// templates (the default one, and desktop, which carries a display), for
// tests that create workspaces without importing an image; Seed adds the
// projects the tests' workspaces belong to.
package templatetest

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/guestabi"
)

// Revision is the one revision of each template PutDefault and
// PutDesktop store.
const Revision = "sha256-1"

// DesktopDisplay is the display of the template PutDesktop stores.
var DesktopDisplay = guestabi.DisplaySize{Width: 1280, Height: 800}

// Seed stores, in st, a project of each ID in projects (named as its ID)
// and the built-in default template, all created at now; the test fails
// on an error.
func Seed(t testing.TB, st store.Store, now time.Time, projects ...string) {
	t.Helper()
	ctx := context.Background()
	err := st.Update(ctx, func(tx store.Tx) error {
		for _, p := range projects {
			if err := tx.CreateProject(ctx, store.Project{ID: p, Name: p, CreatedAt: now}); err != nil {
				return err
			}
		}
		return PutDefault(ctx, tx, now)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// PutDefault stores, in tx, the built-in default template with the one
// revision Revision, created at now.
func PutDefault(ctx context.Context, tx store.Tx, now time.Time) error {
	return put(ctx, tx, templates.DefaultTemplate, nil, now)
}

// PutDesktop stores, in tx, the built-in template desktop with the one
// revision Revision, which carries DesktopDisplay, created at now.
func PutDesktop(ctx context.Context, tx store.Tx, now time.Time) error {
	return put(ctx, tx, "desktop", &DesktopDisplay, now)
}

// put stores the built-in template id with the one revision Revision.
func put(ctx context.Context, tx store.Tx, id string, display *guestabi.DisplaySize, now time.Time) error {
	spec, err := proto.Marshal(&ctrlv1.Template{DefaultRevision: Revision, Revisions: []*ctrlv1.TemplateRevision{{Revision: Revision}}})
	if err != nil {
		return err
	}
	rev, err := templates.EncodeRevision(&ctrlv1.TemplateRevision{Revision: Revision},
		templates.Image{TemplateID: id, Revision: Revision, Display: display})
	if err != nil {
		return err
	}
	if err := tx.CreateObject(ctx, store.Object{Kind: store.KindTemplate, ProjectID: templates.BuiltinProject, ID: id,
		Spec: spec, Revision: 1, LabelsRevision: 1, AnnotationsRevision: 1, CreatedAt: now, UpdatedAt: now}); err != nil {
		return err
	}
	return tx.PutTemplateRevision(ctx, store.TemplateRevision{ProjectID: templates.BuiltinProject, TemplateID: id,
		Revision: Revision, Body: rev, CreatedAt: now})
}
