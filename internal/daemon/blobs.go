package daemon

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/s3blob" // s3:// blob stores
)

// openBlobs opens the deployment's blob store of transfer artifacts (and,
// when named, of template blobs): the
// URL Options.BlobsURL names (s3://bucket?region=..., file:///dir, any
// scheme gocloud.dev/blob opens), else the directory HOME/blobs. A
// directory store writes each blob to a temporary file beside it and
// renames it into place; the temporary files a crash left are removed
// here, before anything writes.
func openBlobs(ctx context.Context, o Options) (*blob.Bucket, error) {
	if o.BlobsURL != "" {
		return blob.OpenBucket(ctx, o.BlobsURL)
	}
	dir := filepath.Join(o.stateDir(), "blobs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := removeStrandedTemps(dir); err != nil {
		return nil, err
	}
	return fileblob.OpenBucket(dir, &fileblob.Options{NoTempDir: true, Metadata: fileblob.MetadataDontWrite})
}

// templateBlobs is the blob store ctrl keeps template blobs in beside its
// image store: the one Options.BlobsURL names, which replicas share. The
// default directory store of a lone deployment would only copy its image
// store.
func templateBlobs(o Options, blobs *blob.Bucket) *blob.Bucket {
	if o.BlobsURL == "" {
		return nil
	}
	return blobs
}

// removeStrandedTemps removes the temporary files of a directory blob
// store (named *.tmp) that a crash left.
func removeStrandedTemps(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".tmp") {
			return os.Remove(p)
		}
		return nil
	})
}
