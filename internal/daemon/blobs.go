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

// openBlobs opens the deployment's blob store of transfer artifacts: the
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
