package oci

import (
	"context"
	"errors"
	"os"

	"github.com/kibotos/kibotos/internal/host/diskimage"
)

// CreateLayer creates an ext4 image of exactly bytes (a whole number of
// MiB) at path, unless a file exists there already; see diskimage.Create.
func (d *Driver) CreateLayer(ctx context.Context, path string, bytes uint64) error {
	return d.public(diskimage.Create(ctx, path, bytes, ""), "", layerPath(path))
}

// GrowLayer grows the image at path and its ext4 filesystem to bytes,
// offline (this host refuses online resize2fs) and crash-safe: a crash
// leaves the old image or the grown one. See diskimage.Grow and
// runtime.Layers.
func (d *Driver) GrowLayer(ctx context.Context, path string, bytes uint64) error {
	return d.public(diskimage.Grow(ctx, path, bytes), "", layerPath(path))
}

// ReserveLayer makes the host's filesystem hold every block of the image
// at path; see diskimage.Reserve.
func (d *Driver) ReserveLayer(path string) error {
	return d.public(diskimage.Reserve(path), "", layerPath(path))
}

// LayerCapacity returns the size of the image at path.
func (d *Driver) LayerCapacity(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, d.public(err, "", layerPath(path))
	}
	if !fi.Mode().IsRegular() {
		return 0, errors.New("oci: <layer image> is not a regular file")
	}
	return uint64(fi.Size()), nil
}

// DeleteLayer removes the image at path; a missing one is fine. An image
// still attached to a loop device (its execution runs) is refused.
func (d *Driver) DeleteLayer(path string) error {
	return d.public(diskimage.Delete(path), "", layerPath(path))
}

// layerPath names the layer image at path for public.
func layerPath(path string) map[string]string { return map[string]string{path: "<layer image>"} }
