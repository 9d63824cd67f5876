package templates

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kibotos/kibotos/internal/imagestore"
)

// unpackedBytes returns what imagestore.Store.UnpackedBytes reports for img
// once unpacked: the summed size of the regular files of each distinct
// layer. When the layers are not unpacked here (ctrl does not unpack), it
// reads their tars instead of extracting them.
func unpackedBytes(ctx context.Context, images *imagestore.Store, img imagestore.Image) (uint64, error) {
	if n, err := images.UnpackedBytes(img); err == nil {
		return n, nil
	}
	var sum uint64
	seen := map[string]bool{}
	for _, l := range img.Layers {
		if seen[l.DiffID] {
			continue
		}
		seen[l.DiffID] = true
		n, err := layerFileBytes(ctx, images, l.Digest)
		if err != nil {
			return 0, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
		sum += n
	}
	return sum, nil
}

// layerFileBytes sums the sizes of the regular files in a layer blob's tar,
// counting entries as the layer's extraction does (whiteouts and links
// hold no content).
func layerFileBytes(ctx context.Context, images *imagestore.Store, digest string) (uint64, error) {
	l, err := partial.CompressedToLayer(blob{images, digest})
	if err != nil {
		return 0, err
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var n uint64
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return 0, fmt.Errorf("%w: reading layer tar: %v", imagestore.ErrInvalidImage, err)
		}
		if strings.HasPrefix(path.Base(hdr.Name), ".wh.") {
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeGNUSparse, tar.TypeCont:
			n += uint64(hdr.Size)
		}
	}
}

// blob is a compressed layer blob of the image store, read through
// go-containerregistry so that gzip, zstd and uncompressed layers all
// decompress as the store's own unpacking does.
type blob struct {
	images *imagestore.Store
	digest string
}

var _ partial.CompressedLayer = blob{}

func (b blob) Compressed() (io.ReadCloser, error) {
	rc, _, err := b.images.Blob(b.digest)
	return rc, err
}

func (b blob) Digest() (v1.Hash, error) { return v1.NewHash(b.digest) }

func (b blob) Size() (int64, error) {
	rc, n, err := b.images.Blob(b.digest)
	if err != nil {
		return 0, err
	}
	rc.Close()
	return n, nil
}

func (b blob) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
