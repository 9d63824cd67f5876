package templates_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/kibotos/kibotos/internal/ctrl/templates"
)

// TestImportCarried imports images a transfer carried: into a new
// Template of the manifest's name, again without a second revision,
// beside the revisions of an existing Template (not as its default), and
// under a derived name when the name is a built-in Template's; an image
// other than the one named is refused.
func TestImportCarried(t *testing.T) {
	forEachStoreWithBuiltin(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := e.client(projectA)
		layoutOf := func() (dir, digest string) {
			img := randomImage(t)
			dir = t.TempDir()
			p := must(layout.Write(dir, empty.Index))(t, "layout")
			if err := p.AppendImage(img); err != nil {
				t.Fatal(err)
			}
			return dir, must(img.Digest())(t, "digest").String()
		}
		dir, digest := layoutOf()
		source := templates.SourceTransfer + "tr_1"
		ref := must(e.svc.ImportCarried(ctx, projectA, "mine", digest, dir, source))(t, "carried")
		again := must(e.svc.ImportCarried(ctx, projectA, "mine", digest, dir, source))(t, "carried again")
		if ref.TemplateId != "mine" || again.TemplateId != "mine" || again.Revision != ref.Revision {
			t.Errorf("refs %v, %v", ref, again)
		}
		tm := must(e.get(c, "mine"))(t, "get")
		if len(tm.Revisions) != 1 || tm.DefaultRevision != ref.Revision {
			t.Errorf("template = %v", tm)
		}
		e.checkRevision(tm.Revisions[0], source)

		// Beside an existing Template's revisions, not its default.
		e.create(c, "other", nil)
		other := must(upload(c, "c1", "other", layoutFormat, layoutArchive(t, randomImage(t)), false))(t, "import").Revision
		dir2, digest2 := layoutOf()
		ref2 := must(e.svc.ImportCarried(ctx, projectA, "other", digest2, dir2, source))(t, "carried beside")
		tm = must(e.get(c, "other"))(t, "get")
		if ref2.TemplateId != "other" || len(tm.Revisions) != 2 || tm.DefaultRevision != other.Revision {
			t.Errorf("template with a carried revision = %v", tm)
		}

		// A built-in's name gets the digest's prefix.
		ref3 := must(e.svc.ImportCarried(ctx, projectA, templates.DefaultTemplate, digest, dir, source))(t, "carried as base")
		if want := "base-" + strings.TrimPrefix(digest, "sha256:")[:12]; ref3.TemplateId != want {
			t.Errorf("carried base is template %q, want %q", ref3.TemplateId, want)
		}

		// Another image than the manifest names.
		_, err := e.svc.ImportCarried(ctx, projectA, "wrong", digest2, dir, source)
		wantCode(t, "carried image of another digest", err, connect.CodeInvalidArgument)
		_, err = e.get(c, "wrong")
		wantCode(t, "template of a refused image", err, connect.CodeNotFound)
	})
}
