package transfers

import (
	"context"
	"testing"

	"gocloud.dev/blob/fileblob"

	"github.com/kibotos/kibotos/internal/testutil"
)

// TestCollectSparesBlobsBeingWritten: the collection of blobs no Transfer
// holds deletes an unknown Transfer's artifact, but not the file the blob
// store writes an artifact into before it renames it into place (beside
// it, <key>.<random>.tmp, as the deployment's file blob store does): that
// deletion failed the write.
func TestCollectSparesBlobsBeingWritten(t *testing.T) {
	ctx := context.Background()
	bucket, err := fileblob.OpenBucket(t.TempDir(), &fileblob.Options{NoTempDir: true, Metadata: fileblob.MetadataDontWrite})
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	s := &Service{Store: testutil.SQLiteStore(t), Bucket: bucket}
	if err := bucket.WriteAll(ctx, artifactPrefix+"tr_gone", []byte("old"), nil); err != nil {
		t.Fatal(err)
	}
	w, err := bucket.NewWriter(ctx, artifactPrefix+"tr_new", nil)
	if err != nil {
		t.Fatal(err)
	}
	// More than the writer sniffs for a content type before the store
	// makes its file.
	if _, err := w.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if err := s.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("a write the collection ran into: %v", err)
	}
	if ok, _ := bucket.Exists(ctx, artifactPrefix+"tr_gone"); ok {
		t.Error("the artifact of an unknown Transfer was kept")
	}
	for key, want := range map[string]bool{"transfers/tr_1": true, "transfers/tr_1.3f2a.tmp": false, "transfers-staging/tr_1.3f2a": true, "transfers/a/b": false} {
		if _, _, ok := transferOfKey(key); ok != want {
			t.Errorf("transferOfKey(%q) ok = %v, want %v", key, ok, want)
		}
	}
}
