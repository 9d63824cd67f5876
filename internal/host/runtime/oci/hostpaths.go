package oci

import (
	"errors"
	"log/slog"
	"path/filepath"

	"github.com/kibotos/kibotos/internal/host/hostpaths"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// The driver's errors reach the callers of the host agent (a failed
// start's message reaches the API), so the host paths in them, which
// say where the host keeps what, are replaced by what they are in angle
// brackets (<layer image>); the whole error goes to the host's log.

// publicError is an error whose message names no host path; Unwrap
// still reaches the driver's error, for errors.Is.
type publicError struct {
	msg string
	err error
}

func (e *publicError) Error() string { return e.msg }
func (e *publicError) Unwrap() error { return e.err }

// specPaths names the host paths of spec.
func specPaths(spec runtime.Spec) map[string]string {
	names := map[string]string{
		spec.LayerImage: "<layer image>",
		spec.GuestAgent: "<guest agent>",
		spec.NetNS:      "<network namespace>",
	}
	for _, l := range spec.Layers {
		names[l] = "<template layer>"
	}
	if spec.Volume != nil {
		names[spec.Volume.Image] = "<volume image>"
	}
	return names
}

// public returns err with the host paths of execution id (none when id
// is empty) and those of extra (path → what it is) replaced, logging err
// whole when that changed it.
func (d *Driver) public(err error, id string, extra map[string]string) error {
	if err == nil {
		return nil
	}
	var pe *publicError
	if errors.As(err, &pe) && pe.msg == err.Error() {
		return err
	}
	names := map[string]string{
		d.stateDir: "<state dir>",
		d.bin:      d.name,
	}
	if validID(id) {
		dir := d.dir(id)
		names[dir] = "<execution dir>"
		for _, sub := range []string{"rootfs", "layer", "volume", "sock", "console"} {
			names[filepath.Join(dir, sub)] = "<execution dir>/" + sub
		}
		if rec, rerr := d.readRecord(id); rerr == nil {
			names[rec.LayerImage] = "<layer image>"
			names[rec.VolumeImage] = "<volume image>"
		}
	}
	for p, name := range extra {
		names[p] = name
		if abs, aerr := filepath.Abs(p); aerr == nil {
			names[abs] = name
		}
	}
	msg := hostpaths.Replace(err.Error(), names)
	if msg == err.Error() {
		return err
	}
	slog.Warn("oci: an error with host paths", "execution", id, "err", err)
	return &publicError{msg: msg, err: err}
}
