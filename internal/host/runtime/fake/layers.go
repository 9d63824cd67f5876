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

// ReserveLayer marks the file at path reserved, or fails as FailReserve
// said; see runtime.Layers.
func (d *Driver) ReserveLayer(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return err
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if err := d.m.failReserve[abs]; err != nil {
		return err
	}
	d.m.reserved[abs] = true
	return nil
}

// Reserved reports whether ReserveLayer reserved the image now at path.
func (d *Driver) Reserved(path string) bool {
	abs, _ := filepath.Abs(path)
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.m.reserved[abs]
}

// ForgetReservations unmarks every image, as on a host whose images an
// older build left sparse.
func (d *Driver) ForgetReservations() {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	clear(d.m.reserved)
}

// FailReserve makes every ReserveLayer of the image at path fail with
// err, as on a host whose disk cannot hold it.
func (d *Driver) FailReserve(path string, err error) {
	abs, _ := filepath.Abs(path)
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.failReserve[abs] = err
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
	abs, _ := filepath.Abs(path)
	d.m.mu.Lock()
	delete(d.m.reserved, abs)
	d.m.mu.Unlock()
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
