package oci

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/diskimage"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// Timeouts of the parts of a stop that do not depend on the caller's
// grace.
const (
	stopMargin     = 5 * time.Second  // after the grace, for the agent to sync and exit
	loopReleaseMax = 10 * time.Second // for a dying mount namespace to let go of the layer
	releaseTimeout = 30 * time.Second // cleanup after a failed Start
)

// Start prepares and starts an execution; see runtime.Driver. The layer
// image and the volume image must not be in use by another execution.
// Leftovers of an earlier, dead execution of the same ID are released
// first.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) (err error) {
	// First deferred, so last run: after the release of a failed start.
	defer func() { err = d.public(err, spec.ID, specPaths(spec)) }()
	if err := d.checkSpec(spec); err != nil {
		return err
	}
	id := spec.ID
	defer d.lock(id)()

	st, err := d.state(ctx, id)
	if err == nil && st.alive() {
		return fmt.Errorf("oci: execution %s exists (%s)", id, st.Status)
	} else if err != nil && !errors.Is(err, errNoContainer) {
		return err
	}
	containerLeft := err == nil
	dir := d.dir(id)
	if _, err := os.Stat(dir); err == nil || containerLeft {
		if _, err := d.release(ctx, id, false); err != nil {
			return fmt.Errorf("oci: releasing the leftovers of %s: %w", id, err)
		}
	}
	image, err := filepath.Abs(spec.LayerImage)
	if err != nil {
		return err
	}
	if devs := diskimage.LoopsOf(image); len(devs) > 0 {
		return fmt.Errorf("oci: layer image %s is in use by %s", image, strings.Join(devs, ", "))
	}
	volume := ""
	if spec.Volume != nil {
		if volume, err = filepath.Abs(spec.Volume.Image); err != nil {
			return err
		}
		if devs := diskimage.LoopsOf(volume); len(devs) > 0 {
			return fmt.Errorf("oci: volume image %s is in use by %s", volume, strings.Join(devs, ", "))
		}
	}

	rec := &record{
		ID:         id,
		Runtime:    d.name,
		LayerImage: image,
		Layers:     spec.Layers,
		LayerMount: filepath.Join(dir, "layer"),
		RootfsPath: filepath.Join(dir, "rootfs"),
		SocketDir:  filepath.Join(dir, "sock"),
		Cgroup:     cgroupPath(id),
		CreatedAt:  time.Now().UTC(),
	}
	if volume != "" {
		rec.VolumeImage, rec.VolumeMount = volume, filepath.Join(dir, "volume")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// From here on a failure releases whatever was set up.
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			defer cancel()
			if _, rerr := d.release(rctx, id, false); rerr != nil {
				err = errors.Join(err, fmt.Errorf("oci: releasing after the failed start: %w", rerr))
			}
		}
	}()
	if err := d.writeRecord(rec); err != nil {
		return err
	}
	if err := d.mountLayers(rec); err != nil {
		return err
	}
	if rec.VolumeImage != "" {
		if err := d.mountVolume(rec); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(rec.SocketDir, 0o700); err != nil {
		return err
	}
	// The guest can write to its socket directory: a small tmpfs keeps it
	// from filling the host's disk there (release unmounts it with the rest).
	if err := unix.Mount("tmpfs", rec.SocketDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		"size=1m,nr_inodes=64,mode=0700"); err != nil {
		return fmt.Errorf("oci: socket directory: %w", err)
	}
	if spec.ResolvConf != nil {
		// In the small tmpfs too: the guest can write to its copy.
		if err := os.WriteFile(filepath.Join(rec.SocketDir, resolvConfName), spec.ResolvConf, 0o644); err != nil {
			return fmt.Errorf("oci: resolv.conf: %w", err)
		}
	}
	if err := writeIdentity(rec.SocketDir, guestHostname(spec)); err != nil {
		return fmt.Errorf("oci: /etc/hostname and /etc/hosts: %w", err)
	}
	if err := mountConsole(dir); err != nil {
		return err
	}
	config := ociSpec(spec, rec.RootfsPath, rec.SocketDir, rec.VolumeMount, d.tmpfsBytes(spec.MemoryBytes), d.oomAdj)
	volumePath := ""
	if spec.Volume != nil {
		volumePath = spec.Volume.Path
	}
	if err := prepareMountPoints(rec.RootfsPath, config.Mounts, volumePath); err != nil {
		return err
	}
	b, err := marshalSpec(config)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.runDetached(ctx, id, dir, consoleLog(dir))
}

// checkSpec rejects a spec the driver cannot run.
func (d *Driver) checkSpec(spec runtime.Spec) error {
	if err := checkID(spec.ID); err != nil {
		return err
	}
	if len(spec.Layers) == 0 {
		return errors.New("oci: an execution needs at least one layer")
	}
	for _, l := range spec.Layers {
		if !filepath.IsAbs(l) || strings.ContainsAny(l, ",:\n") {
			return fmt.Errorf("oci: layer path %q must be absolute, without ',' ':' or newlines", l)
		}
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return fmt.Errorf("oci: layer %s is not a directory", l)
		}
	}
	if strings.ContainsAny(d.stateDir, ",:\n") {
		return fmt.Errorf("oci: state dir %q must not contain ',' ':' or newlines", d.stateDir)
	}
	if fi, err := os.Stat(spec.LayerImage); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("oci: layer image %q is not a regular file", spec.LayerImage)
	}
	if spec.Volume != nil {
		if err := checkVolume(spec.Volume, spec.LayerImage); err != nil {
			return err
		}
	}
	if !filepath.IsAbs(spec.GuestAgent) {
		return fmt.Errorf("oci: guest agent path %q must be absolute", spec.GuestAgent)
	}
	if fi, err := os.Stat(spec.GuestAgent); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("oci: guest agent %q is not an executable file", spec.GuestAgent)
	}
	return nil
}

// mountLayers loop-mounts the writable layer and mounts the overlay
// rootfs over the read-only layers.
func (d *Driver) mountLayers(rec *record) error {
	for _, p := range []string{rec.LayerMount, rec.RootfsPath} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return err
		}
	}
	dev, f, err := attachExclusive(rec.LayerImage, "layer image")
	if err != nil {
		return err
	}
	rec.LoopDevice = dev
	err = d.writeRecord(rec)
	if err == nil {
		err = unix.Mount(dev, rec.LayerMount, "ext4", unix.MS_NODEV, "")
		if err != nil {
			err = fmt.Errorf("oci: mounting %s (%s): %w", rec.LayerImage, dev, err)
		}
	}
	f.Close() // the mount holds the device now; without one, autoclear frees it
	if err != nil {
		return err
	}
	upper := filepath.Join(rec.LayerMount, "upper")
	work := filepath.Join(rec.LayerMount, "work")
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	// The upper directory is the guest's root directory.
	if err := os.Chmod(upper, 0o755); err != nil {
		return err
	}
	lower := slices.Clone(rec.Layers)
	slices.Reverse(lower) // overlay lists the top layer first
	opts := overlayOptions(lower, upper, work)
	if len(opts) >= os.Getpagesize() {
		// The options must fit in a page: name the layers by descriptors
		// (/proc/self/fd/N, about 17 bytes each) while the mount resolves
		// them, which holds several times as many layers.
		short, closeAll, err := descriptorPaths(lower)
		if err != nil {
			return err
		}
		defer closeAll()
		if opts = overlayOptions(short, upper, work); len(opts) >= os.Getpagesize() {
			return fmt.Errorf("oci: an image of %d layers: overlay options of %d bytes exceed a page", len(lower), len(opts))
		}
	}
	if err := unix.Mount("overlay", rec.RootfsPath, "overlay", 0, opts); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			// The overlay's work directory takes an inode and a block of
			// the workspace's own disk.
			return fmt.Errorf("oci: the workspace's disk has no space or inodes left to start on: grow it (kibotos ws disk): %w", err)
		}
		return fmt.Errorf("oci: mounting the overlay rootfs: %w", err)
	}
	return nil
}

// overlayOptions are the mount options of an overlay of lower (top
// first) under upper.
func overlayOptions(lower []string, upper, work string) string {
	return "lowerdir=" + strings.Join(lower, ":") + ",upperdir=" + upper + ",workdir=" + work
}

// descriptorPaths opens each of dirs and returns paths that name them by
// descriptor, and a function that closes the descriptors.
func descriptorPaths(dirs []string) ([]string, func(), error) {
	var fds []int
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	paths := make([]string, 0, len(dirs))
	for _, dir := range dirs {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("oci: opening layer %s: %w", dir, err)
		}
		fds = append(fds, fd)
		paths = append(paths, fmt.Sprintf("/proc/self/fd/%d", fd))
	}
	return paths, closeAll, nil
}

// Stop ends an execution and releases it; see runtime.Driver. StopNormal
// asks the guest agent to stop (STOP <grace-ms>: TERM, grace, KILL, sync),
// falling back to SIGUSR2 for the agent and SIGKILL after grace plus a
// margin; then it syncs and unmounts the volume and the layer plainly:
// Confirmed is true when all of that succeeded. StopForce kills at once
// and may unmount lazily; Confirmed is false. Stopping an unknown execution succeeds with
// Confirmed false: there is nothing to confirm.
func (d *Driver) Stop(ctx context.Context, id string, mode runtime.StopMode, grace time.Duration) (res runtime.StopResult, err error) {
	if err := checkID(id); err != nil {
		return runtime.StopResult{}, err
	}
	defer d.lock(id)()
	// Before the lock is released, while the record names the images.
	defer func() { err = d.public(err, id, nil) }()
	st, err := d.state(ctx, id)
	if err != nil && !errors.Is(err, errNoContainer) {
		return runtime.StopResult{}, err
	}
	exists := err == nil
	if !exists {
		if _, err := os.Stat(d.dir(id)); errors.Is(err, os.ErrNotExist) {
			return runtime.StopResult{}, removeCgroups(id)
		}
	}
	normal := mode == runtime.StopNormal
	if exists && st.alive() {
		if normal && st.Status == "running" {
			d.stopGuest(ctx, id, grace)
			if st, err = d.state(ctx, id); err != nil && !errors.Is(err, errNoContainer) {
				return runtime.StopResult{}, err
			}
		}
		if st.alive() {
			if err := d.kill(ctx, id, "KILL"); err != nil {
				return runtime.StopResult{}, err
			}
			// The runtime's delete of a container whose init has not
			// ended yet kills it again and polls (runc every 100 ms): wait
			// for the exit, which the pidfd tells at once.
			wctx, cancel := context.WithTimeout(ctx, killWait)
			d.waitStopped(wctx, id)
			cancel()
		}
	}
	confirmed, err := d.release(ctx, id, normal)
	return runtime.StopResult{Confirmed: normal && confirmed}, err
}

// killWait bounds the wait for a killed init to end before its container
// is deleted; the delete kills what is left.
const killWait = 5 * time.Second

// stopGuest asks the guest agent to end the guest within grace and waits
// for its init to exit; if the agent does not answer, it sends SIGUSR2
// (which the agent takes as the guest's poweroff: never as a reset) and
// waits. It returns once init has ended or the wait timed out; the caller
// kills what is left.
func (d *Driver) stopGuest(ctx context.Context, id string, grace time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, grace+stopMargin)
	defer cancel()
	if err := d.stopAgent(wctx, id, grace); err != nil {
		if d.kill(wctx, id, "USR2") != nil {
			return
		}
	}
	d.waitStopped(wctx, id)
}

// release removes everything of an execution but its layer and volume
// images: the container, the mounts, the loop devices, the cgroups and
// its directory. With clean, the volume and the layer are synced and
// must unmount plainly; confirmed reports that they did and the images
// were synced.
func (d *Driver) release(ctx context.Context, id string, clean bool) (confirmed bool, err error) {
	// Last, after the directory is gone (see guestProbe).
	defer d.dropProbe(id)
	dir := d.dir(id)
	rootfs, layer, volume := filepath.Join(dir, "rootfs"), filepath.Join(dir, "layer"), filepath.Join(dir, "volume")
	// Nothing is unmounted under a container that may still run.
	if err := d.deleteContainer(ctx, id); err != nil {
		return false, fmt.Errorf("oci: releasing %s: %w", id, err)
	}
	var errs []error
	image, volumeImage := "", ""
	if rec, err := d.readRecord(id); err == nil {
		image, volumeImage = rec.LayerImage, rec.VolumeImage
	} else {
		// No record (it should have been written first): ask the devices.
		if src := mountSource(layer); strings.HasPrefix(src, "/dev/loop") {
			image, _ = diskimage.BackingFile(src)
		}
		if src := mountSource(volume); strings.HasPrefix(src, "/dev/loop") {
			volumeImage, _ = diskimage.BackingFile(src)
		}
	}

	// One read of the mount table serves every unmount below dir.
	mounted, err := mountsUnder(dir)
	if err != nil {
		return false, fmt.Errorf("oci: releasing %s: %w", id, err)
	}
	confirmed = clean
	plain, err := unmountPoints(within(mounted, rootfs))
	confirmed = confirmed && plain
	errs = append(errs, err)
	for _, mp := range []string{volume, layer} {
		if clean && slices.Contains(mounted, mp) {
			// A filesystem that cannot sync (its journal aborted, say, and
			// it went read-only) still unmounts: the stop is unconfirmed.
			if err := syncfs(mp); err != nil {
				confirmed = false
				slog.Warn("oci: a filesystem did not sync at a stop", "execution", id, "err", err)
			}
		}
		plain, err = unmountPoints(within(mounted, mp))
		confirmed = confirmed && plain
		errs = append(errs, err)
	}
	_, err = unmountPoints(slices.DeleteFunc(within(mounted, dir), func(p string) bool {
		return isWithin(p, rootfs) || isWithin(p, volume) || isWithin(p, layer)
	}))
	errs = append(errs, err)

	for _, img := range []struct{ what, path string }{{"layer", image}, {"volume", volumeImage}} {
		if img.path == "" {
			continue
		}
		if !diskimage.WaitLoopsReleased(img.path, loopReleaseMax) {
			confirmed = false
			err := fmt.Errorf("%s image %s is still attached to a loop device", img.what, img.path)
			if holders := diskimage.Holders(img.path, 3); len(holders) > 0 {
				err = fmt.Errorf("%w: another mount namespace holds a copy of its mount, that of %s (one made while it was mounted, as unshare -m makes); it is released when those processes end",
					err, strings.Join(holders, ", "))
			}
			errs = append(errs, err)
		} else if clean {
			if err := fsyncFile(img.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				confirmed = false
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, removeCgroups(id))
	if err := errors.Join(errs...); err != nil {
		return false, fmt.Errorf("oci: releasing %s: %w", id, err)
	}
	// Only once nothing is mounted below dir may it be removed: the
	// layer's or the volume's mount point would otherwise lead into the
	// user's data. removeSameFS looks at each directory before it enters
	// it; where the kernel cannot tell it a mount's root, the table is
	// read again.
	if _, known, _ := mountRoot(dir); !known {
		if pts, err := mountsUnder(dir); err != nil || len(pts) > 0 {
			return false, fmt.Errorf("oci: releasing %s: still mounted: %v %v", id, pts, err)
		}
	}
	if err := removeSameFS(dir); err != nil {
		return false, fmt.Errorf("oci: releasing %s: %w", id, err)
	}
	return confirmed, nil
}

// Recover re-adopts the executions of an earlier process of this host
// agent; see runtime.Driver. Executions whose init still runs (running or
// paused) are returned; the leftovers of every other one, and containers
// of the driver's runtime root that have no directory, are released.
func (d *Driver) Recover(ctx context.Context) ([]string, error) {
	ids, err := d.knownIDs()
	if err != nil {
		return nil, err
	}
	var errs []error
	listed, err := d.list(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, id := range listed {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var running []string
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return running, err
		}
		alive, err := d.recoverOne(ctx, id)
		if err != nil {
			errs = append(errs, err)
		}
		if alive {
			running = append(running, id)
		}
	}
	return running, errors.Join(errs...)
}

func (d *Driver) recoverOne(ctx context.Context, id string) (bool, error) {
	defer d.lock(id)()
	st, err := d.state(ctx, id)
	switch {
	case err == nil && (st.Status == "running" || st.Status == "paused"):
		return true, nil
	case err != nil && !errors.Is(err, errNoContainer):
		return false, err
	case err == nil && d.guestShutdown(id):
		return true, nil // its caller learns of the shutdown, then stops it
	}
	_, err = d.release(ctx, id, false)
	return false, err
}

func fsyncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// removeSameFS removes dir and everything below it, refusing to descend
// into another filesystem or a mount point: a mount missed by the
// caller's checks must never lead into a layer's data.
func removeSameFS(dir string) error {
	var root unix.Stat_t
	if err := unix.Lstat(dir, &root); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	return removeTree(dir, root.Dev)
}

func removeTree(path string, dev uint64) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if st.Dev != dev {
			return fmt.Errorf("oci: %s is on another filesystem; not removing it", path)
		}
		// A bind mount of the same filesystem has the same device.
		if root, _, _ := mountRoot(path); root {
			return fmt.Errorf("oci: %s is a mount point; not removing it", path)
		}
		ents, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := removeTree(filepath.Join(path, e.Name()), dev); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
