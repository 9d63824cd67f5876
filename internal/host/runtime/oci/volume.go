package oci

import (
	"github.com/kibotos/kibotos/internal/guestabi"

	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/diskimage"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// checkVolume rejects a volume the driver cannot mount.
func checkVolume(v *runtime.VolumeMount, layerImage string) error {
	fi, err := os.Stat(v.Image)
	if err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("oci: volume image %q is not a regular file", v.Image)
	}
	if li, err := os.Stat(layerImage); err == nil && os.SameFile(fi, li) {
		return fmt.Errorf("oci: volume image %q is the layer image", v.Image)
	}
	if err := guestabi.CheckVolumePath(v.Path); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	return nil
}

// attachExclusive attaches image to a loop device like
// diskimage.AttachLoop, and fails unless that device is the image's only
// one: of two starts that raced past the in-use check with the same
// image, at most one mounts it (each looks after attaching, before
// mounting).
func attachExclusive(image, what string) (string, *os.File, error) {
	dev, f, err := diskimage.AttachLoop(image)
	if err != nil {
		return "", nil, fmt.Errorf("oci: attaching %s: %w", image, err)
	}
	if devs := diskimage.LoopsOf(image); len(devs) != 1 {
		f.Close() // never mounted: autoclear frees the device
		return "", nil, fmt.Errorf("oci: %s %s is in use by %s", what, image, strings.Join(devs, ", "))
	}
	return dev, f, nil
}

// mountVolume loop-mounts the volume image at rec.VolumeMount. The
// device goes into the record before the mount, so that a crash leaves
// nothing release cannot find.
func (d *Driver) mountVolume(rec *record) error {
	if err := os.MkdirAll(rec.VolumeMount, 0o700); err != nil {
		return err
	}
	dev, f, err := attachExclusive(rec.VolumeImage, "volume image")
	if err != nil {
		return err
	}
	rec.VolumeDevice = dev
	err = d.writeRecord(rec)
	if err == nil {
		err = unix.Mount(dev, rec.VolumeMount, "ext4", unix.MS_NODEV|unix.MS_NOSUID, "")
		if err != nil {
			err = fmt.Errorf("oci: mounting the volume %s (%s): %w", rec.VolumeImage, dev, err)
		}
	}
	f.Close() // the mount holds the device now; without one, autoclear frees it
	return err
}

// VolumeUsage returns the bytes in use and the capacity of the volume of
// a running execution (statfs of its mount on the host); see
// runtime.Driver.
func (d *Driver) VolumeUsage(ctx context.Context, id string) (used, capacity uint64, err error) {
	if err := checkID(id); err != nil {
		return 0, 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	rec, err := d.readRecord(id)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, runtime.ErrNotFound
	}
	if err != nil {
		return 0, 0, err
	}
	if rec.VolumeImage == "" {
		return 0, 0, fmt.Errorf("%w: execution %s has no volume", runtime.ErrNotFound, id)
	}
	used, capacity, mounted, err := mountedUsage(rec.VolumeMount)
	if err != nil {
		return 0, 0, d.public(err, id, nil)
	}
	if !mounted {
		return 0, 0, fmt.Errorf("%w: the volume of %s is not mounted", runtime.ErrNotFound, id)
	}
	return used, capacity, nil
}
