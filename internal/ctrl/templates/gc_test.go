package templates_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestCollectBlobs: once a Template is deleted, the blobs only its
// revisions used are removed (by a store opened afresh, as after a
// restart); blobs of live Templates of every project stay, and so does
// whatever an import committed within the grace.
func TestCollectBlobs(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testutil.SQLiteStore(t))
	a, b := e.client(projectA), e.client(projectB)
	e.create(a, "kept", nil)
	e.create(a, "deleted", nil)
	e.create(b, "other", nil)
	kept, deleted, other := randomImage(t), randomImage(t), randomImage(t)
	digestOf := func(r *ctrlv1.ImportTemplateRevisionResponse, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r.GetRevision().GetImageDigest()
	}
	keptDigest := digestOf(upload(a, "i1", "kept", tarballFormat, dockerArchive(t, kept), false))
	deletedDigest := digestOf(upload(a, "i2", "deleted", tarballFormat, dockerArchive(t, deleted), false))
	otherDigest := digestOf(upload(b, "i3", "other", tarballFormat, dockerArchive(t, other), false))
	if _, err := a.DeleteTemplate(ctx, connect.NewRequest(&ctrlv1.DeleteTemplateRequest{Command: cmd("d"), TemplateId: "deleted"})); err != nil {
		t.Fatal(err)
	}
	blobsOf := func(manifest string) []string {
		img, err := e.images.Image(manifest)
		if err != nil {
			t.Fatal(err)
		}
		return img.Blobs()
	}
	deletedBlobs := blobsOf(deletedDigest)

	// Within the grace nothing goes.
	if removed, err := templates.CollectBlobs(ctx, e.st, e.images, time.Now().Add(-templates.BlobGrace)); err != nil || len(removed) != 0 {
		t.Fatalf("collection within the grace removed %v, %v", removed, err)
	}
	old := time.Now().Add(-2 * templates.BlobGrace)
	blobDir := filepath.Join(e.images.Dir(), "blobs", "sha256")
	ents, err := os.ReadDir(blobDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ents {
		if err := os.Chtimes(filepath.Join(blobDir, d.Name()), old, old); err != nil {
			t.Fatal(err)
		}
	}

	restarted, err := imagestore.Open(e.images.Dir())
	if err != nil {
		t.Fatal(err)
	}
	removed, err := templates.CollectBlobs(ctx, e.st, restarted, time.Now().Add(-templates.BlobGrace))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	slices.Sort(deletedBlobs)
	if !slices.Equal(removed, deletedBlobs) {
		t.Errorf("removed %v, want the deleted template's blobs %v", removed, deletedBlobs)
	}
	for _, m := range []string{keptDigest, otherDigest} {
		for _, d := range blobsOf(m) {
			if !restarted.HasBlob(d) {
				t.Errorf("blob %s of a live template was removed", d)
			}
		}
	}
	// The live template still takes a new import of the deleted image.
	e.create(a, "again", nil)
	if got := digestOf(upload(a, "i4", "again", tarballFormat, dockerArchive(t, deleted), false)); got != deletedDigest {
		t.Errorf("re-import is %s, want %s", got, deletedDigest)
	}
}
