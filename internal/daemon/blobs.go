package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/s3blob" // s3:// blob stores
	"gocloud.dev/gcerrors"

	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/store"
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
// store (named *.tmp) that a crash left, and the empty directories of
// transfers-staging/, one per transfer, that earlier versions left.
func removeStrandedTemps(dir string) error {
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
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
	staging := filepath.Join(dir, "transfers-staging")
	ents, _ := os.ReadDir(staging)
	for _, e := range ents {
		if e.IsDir() {
			os.Remove(filepath.Join(staging, e.Name())) // only when empty
		}
	}
	return err
}

// blobsOwnerKey is the object of a blob store that names the deployment
// it belongs to; deploymentIDSetting is that deployment's ID in its store,
// which its replicas share.
const (
	blobsOwnerKey       = "kibotos-deployment"
	deploymentIDSetting = "deployment_id"
)

// claimBlobs makes the blob store this deployment's, or refuses it when
// it is another's: each deployment deletes the blobs its own records do
// not hold (finished transfers, unused template blobs), so two deployments
// on one store would delete each other's artifacts. where names the store
// in the error (empty: the home's).
func claimBlobs(ctx context.Context, st store.Store, bucket *blob.Bucket, where string) error {
	id, err := settingOrNew(ctx, st, deploymentIDSetting, func() string { return ids.New("dep") })
	if err != nil {
		return err
	}
	owner, err := bucket.ReadAll(ctx, blobsOwnerKey)
	switch {
	case gcerrors.Code(err) == gcerrors.NotFound:
		if err := bucket.WriteAll(ctx, blobsOwnerKey, []byte(id), nil); err != nil {
			return fmt.Errorf("blob store: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("blob store: %w", err)
	case string(owner) != id:
		if where == "" {
			where = "HOME/blobs"
		}
		return fmt.Errorf("blob store %s belongs to another deployment (%s; this one is %s): a deployment deletes the blobs its own records do not hold, so it would delete the other's transfer artifacts; give each deployment a store of its own (replicas of one deployment, on one database, share theirs)",
			where, owner, id)
	}
	return nil
}
