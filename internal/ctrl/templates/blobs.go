package templates

import (
	"context"
	"fmt"
	"io"
	"strings"

	gcblob "gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/kibotos/kibotos/internal/imagestore"
)

// BlobPrefix is where the deployment's blob store keeps template blobs:
// BlobPrefix + <hex of the sha256 digest>.
const BlobPrefix = "templates/sha256/"

// Blobs are the template blobs a control plane serves: those of its image
// store, which with a Bucket is this replica's cache of the deployment's
// blob store. An import through any replica puts its image's blobs in the
// Bucket before the revision is recorded, and a replica missing a blob
// fetches it (verified against its digest) from there, so any replica
// delivers any template.
type Blobs struct {
	Images *imagestore.Store
	// Bucket is the deployment's blob store; nil keeps templates in
	// Images alone (a deployment of one ctrl).
	Bucket *gcblob.Bucket
}

// Blob opens the blob with this digest and returns it with its size;
// imagestore.ErrNotFound when neither the image store nor the bucket
// holds it.
func (b *Blobs) Blob(ctx context.Context, digest string) (io.ReadCloser, int64, error) {
	if err := b.fetch(ctx, digest); err != nil {
		return nil, 0, err
	}
	return b.Images.Blob(digest)
}

// Image returns the image of manifestDigest, fetching its blobs into the
// image store first when some are only in the bucket.
func (b *Blobs) Image(ctx context.Context, manifestDigest string) (imagestore.Image, error) {
	if err := b.fetch(ctx, manifestDigest); err != nil {
		return imagestore.Image{}, err
	}
	img, err := b.Images.Image(manifestDigest)
	if err != nil {
		return imagestore.Image{}, err
	}
	for _, d := range img.Blobs() {
		if err := b.fetch(ctx, d); err != nil {
			return imagestore.Image{}, err
		}
	}
	return img, nil
}

// Share puts the blobs of img that the bucket lacks in it; without a
// Bucket it does nothing.
func (b *Blobs) Share(ctx context.Context, img imagestore.Image) error {
	if b == nil || b.Bucket == nil {
		return nil
	}
	for _, d := range img.Blobs() {
		key, err := blobKey(d)
		if err != nil {
			return err
		}
		if ok, err := b.Bucket.Exists(ctx, key); err != nil || ok {
			if err != nil {
				return fmt.Errorf("template blob %s: %w", d, err)
			}
			continue
		}
		if err := b.upload(ctx, key, d); err != nil {
			return fmt.Errorf("template blob %s: %w", d, err)
		}
	}
	return nil
}

func (b *Blobs) upload(ctx context.Context, key, digest string) error {
	r, _, err := b.Images.Blob(digest)
	if err != nil {
		return err
	}
	defer r.Close()
	// A failed or cancelled write leaves nothing under key.
	return b.Bucket.Upload(ctx, key, r, &gcblob.WriterOptions{ContentType: "application/octet-stream"})
}

// fetch copies the blob digest from the bucket into the image store unless
// the store holds it.
func (b *Blobs) fetch(ctx context.Context, digest string) error {
	if b.Bucket == nil || b.Images.HasBlob(digest) {
		return nil
	}
	key, err := blobKey(digest)
	if err != nil {
		return err
	}
	r, err := b.Bucket.NewReader(ctx, key, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return fmt.Errorf("blob %s: %w", digest, imagestore.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("template blob %s: %w", digest, err)
	}
	defer r.Close()
	// PutBlob verifies the content against the digest.
	return b.Images.PutBlob(digest, r)
}

// blobKey is the bucket key of the blob digest (sha256:<hex>).
func blobKey(digest string) (string, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", fmt.Errorf("blob %q: %w", digest, imagestore.ErrInvalidDigest)
	}
	return BlobPrefix + hex, nil
}

// Image returns the image of manifestDigest from the image store, fetched
// from the deployment's blob store when only that holds it.
func (s *Service) Image(ctx context.Context, manifestDigest string) (imagestore.Image, error) {
	if s.Shared != nil {
		return s.Shared.Image(ctx, manifestDigest)
	}
	return s.Images.Image(manifestDigest)
}
