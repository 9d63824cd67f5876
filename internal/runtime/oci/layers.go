package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

const mib = 1 << 20

// CreateLayer creates an ext4 image of exactly bytes (a whole number of
// MiB) at path, unless a file exists there already. The image is built
// under a temporary name and renamed into place, so a crash never leaves
// a half-made image at path. The filesystem keeps its journal: it is what
// makes a forced stop recoverable.
func (d *Driver) CreateLayer(ctx context.Context, path string, bytes uint64) error {
	if bytes == 0 || bytes%mib != 0 {
		return fmt.Errorf("oci: layer size %d is not a whole, positive number of MiB", bytes)
	}
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	// A crash during an earlier attempt left its half-made image behind.
	if err := removeTemps(path); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Truncate(int64(bytes)); err != nil {
		return err
	}
	if err := mkfs(ctx, tmp); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return syncDir(filepath.Dir(path))
}

// mkfs formats image as ext4 owned by root, with no blocks reserved for
// root (the image is the workspace's own disk).
func mkfs(ctx context.Context, image string) error {
	bin, err := lookPath("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("oci: mkfs.ext4: %w", err)
	}
	cmd := exec.CommandContext(ctx, bin, "-F", "-q", "-m", "0", "-E", "root_owner=0:0", image)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("oci: mkfs.ext4: %v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// GrowLayer grows the image at path and its ext4 filesystem to bytes,
// offline (this host refuses online resize2fs): e2fsck, extend the file,
// resize2fs, sync. See runtime.Layers.
func (d *Driver) GrowLayer(ctx context.Context, path string, bytes uint64) error {
	if bytes == 0 || bytes%mib != 0 {
		return fmt.Errorf("oci: layer size %d is not a whole, positive number of MiB", bytes)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if uint64(fi.Size()) >= bytes {
		return nil
	}
	if devs := loopsOf(path); len(devs) > 0 {
		return fmt.Errorf("oci: layer image %s is in use by %s", path, strings.Join(devs, ", "))
	}
	// resize2fs wants a freshly checked filesystem; e2fsck -p exits 1 when
	// it corrected something, which is fine.
	if err := run(ctx, "e2fsck", "-f", "-p", path); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			return err
		}
	}
	if err := os.Truncate(path, int64(bytes)); err != nil {
		return err
	}
	if err := run(ctx, "resize2fs", path); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// run runs a tool of e2fsprogs, returning its output with a failure.
func run(ctx context.Context, tool string, args ...string) error {
	bin, err := lookPath(tool)
	if err != nil {
		return fmt.Errorf("oci: %s: %w", tool, err)
	}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("oci: %s: %w: %s", tool, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// LayerCapacity returns the size of the image at path.
func (d *Driver) LayerCapacity(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("oci: layer image %s is not a regular file", path)
	}
	return uint64(fi.Size()), nil
}

// DeleteLayer removes the image at path; a missing one is fine. An image
// still attached to a loop device (its execution runs) is refused.
func (d *Driver) DeleteLayer(path string) error {
	if devs := loopsOf(path); len(devs) > 0 {
		return fmt.Errorf("oci: layer image %s is in use by %s", path, strings.Join(devs, ", "))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return removeTemps(path)
}

// removeTemps removes the temporary images CreateLayer makes for path.
// Callers serialize work on one layer, so none is in use.
func removeTemps(path string) error {
	temps, err := filepath.Glob(filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*"))
	if err != nil {
		return err
	}
	for _, t := range temps {
		if err := os.Remove(t); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
