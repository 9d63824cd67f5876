package fake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// CreateLayer creates a sparse file of bytes at path unless one exists;
// see runtime.Layers.
func (d *Driver) CreateLayer(ctx context.Context, path string, bytes uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if bytes == 0 || bytes%(1<<20) != 0 {
		return fmt.Errorf("fake: layer size %d is not a whole, positive number of MiB", bytes)
	}
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return sparseFile(path, bytes)
}

// GrowLayer extends the file at path to bytes, unless it is that large or
// in use; see runtime.Layers.
func (d *Driver) GrowLayer(ctx context.Context, path string, bytes uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d.InUse(path) {
		return fmt.Errorf("fake: layer image %s is in use", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if uint64(fi.Size()) >= bytes {
		return nil
	}
	return os.Truncate(path, int64(bytes))
}

// LayerCapacity returns the size of the file at path.
func (d *Driver) LayerCapacity(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return uint64(fi.Size()), nil
}

// DeleteLayer removes the file at path unless it is in use; a missing one
// is fine.
func (d *Driver) DeleteLayer(path string) error {
	if d.InUse(path) {
		return fmt.Errorf("fake: layer image %s is in use", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// sparseFile creates a file of bytes at path that takes no room.
func sparseFile(path string, bytes uint64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(bytes))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Image creates a sparse file of bytes at path for a test to use as a
// volume image.
func Image(path string, bytes uint64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return sparseFile(path, bytes)
}
