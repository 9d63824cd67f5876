package diskimage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/mountinfo"
)

// GrowOnline grows the image at path, attached to the loop device device
// and mounted, and its filesystem to at least bytes while it stays
// mounted: extend the file, make the device see the new size
// (LOOP_SET_CAPACITY), resize2fs the mounted filesystem. A file already
// that large is not extended, but the filesystem still grows to the
// device's size (finishing an interrupted call). The kernel must allow
// it: many hosts do not (resize2fs needs CAP_SYS_RESOURCE); see
// ProbeOnlineGrow.
func GrowOnline(ctx context.Context, path, device string, bytes uint64) error {
	if err := checkSize(bytes); err != nil {
		return err
	}
	if !slices.Contains(LoopsOf(path), device) {
		return fmt.Errorf("diskimage: %s is not attached to %s", path, device)
	}
	if !mounted(device) {
		return fmt.Errorf("diskimage: %s (%s) is not mounted; grow it offline", path, device)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	dev, err := os.OpenFile(device, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer dev.Close()
	old := fi.Size()
	if uint64(old) < bytes {
		if err := os.Truncate(path, int64(bytes)); err != nil {
			return err
		}
	}
	err = setCapacity(dev)
	if err == nil {
		err = run(ctx, "resize2fs", device)
	}
	if err != nil && uint64(old) < bytes {
		// Give the file its old size back, unless the filesystem grew
		// past it after all: the device's superblock (read through the
		// same cache the mounted filesystem writes) is the current one.
		if sb, serr := readSuper(dev); serr == nil && sb.bytes() <= uint64(old) {
			if os.Truncate(path, old) == nil {
				setCapacity(dev)
			}
		}
	}
	return err
}

// setCapacity makes the loop device dev see the current size of its
// backing file.
func setCapacity(dev *os.File) error {
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("diskimage: LOOP_SET_CAPACITY %s: %w", dev.Name(), err)
	}
	return nil
}

// mounted reports whether device is the source of a mount of this mount
// namespace.
func mounted(device string) bool {
	esc, found := mountinfo.Escape(device), false
	mountinfo.Scan(func(line []byte) {
		if src, ok := mountinfo.Source(line); ok && string(src) == esc {
			found = true
		}
	})
	return found
}

// ProbeOnlineGrow finds out whether this host lets GrowOnline grow a
// mounted image: it makes a scratch image in a temporary directory under
// dir, mounts it there, grows it online and checks that the mount sees
// the new size, then removes all of it. nil means online growth works;
// otherwise the error says why not.
func ProbeOnlineGrow(ctx context.Context, dir string) (err error) {
	// A probe the process was killed in left its directory, maybe mounted.
	left, _ := filepath.Glob(filepath.Join(dir, probePattern))
	for _, scratch := range left {
		if err := removeProbe(scratch); err != nil {
			return err
		}
	}
	scratch, err := os.MkdirTemp(dir, probePattern)
	if err != nil {
		return err
	}
	image, mnt := filepath.Join(scratch, "probe.img"), filepath.Join(scratch, "mnt")
	defer func() { err = errors.Join(err, removeProbe(scratch)) }()
	const before, after = 16 * MiB, 32 * MiB
	if err := Create(ctx, image, before, ""); err != nil {
		return err
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	dev, f, err := AttachLoop(image)
	if err != nil {
		return fmt.Errorf("diskimage: attaching %s: %w", image, err)
	}
	err = unix.Mount(dev, mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, "")
	f.Close() // the mount holds the device now; without one, autoclear frees it
	if err != nil {
		return fmt.Errorf("diskimage: mounting %s (%s): %w", image, dev, err)
	}
	_, total0, err := Usage(mnt)
	if err != nil {
		return err
	}
	if err := GrowOnline(ctx, image, dev, after); err != nil {
		return fmt.Errorf("diskimage: online grow is refused on this host: %w", err)
	}
	_, total1, err := Usage(mnt)
	if err != nil {
		return err
	}
	if total1 <= total0 {
		return fmt.Errorf("diskimage: online grow had no effect on this host: %d bytes before, %d after", total0, total1)
	}
	return nil
}

// probePattern names the scratch directories of ProbeOnlineGrow.
const probePattern = ".online-grow-probe-*"

// removeProbe unmounts and removes a scratch directory of
// ProbeOnlineGrow.
func removeProbe(scratch string) error {
	image, mnt := filepath.Join(scratch, "probe.img"), filepath.Join(scratch, "mnt")
	var errs []error
	if isMount(mnt) {
		if e := unix.Unmount(mnt, 0); e != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mnt, e))
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	}
	if !WaitLoopsReleased(image, 10*time.Second) {
		errs = append(errs, fmt.Errorf("%s is still attached to a loop device", image))
	} else if e := os.RemoveAll(scratch); e != nil {
		errs = append(errs, e)
	}
	if e := errors.Join(errs...); e != nil {
		return fmt.Errorf("diskimage: cleaning up the online grow probe: %w", e)
	}
	return nil
}

// isMount reports whether path is a mount point: its device differs
// from its parent's.
func isMount(path string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Lstat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// Usage returns the bytes in use and the total bytes of the filesystem
// mounted at mountpoint (statfs), e.g. a mounted image's.
func Usage(mountpoint string) (used, total uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(mountpoint, &st); err != nil {
		return 0, 0, &os.PathError{Op: "statfs", Path: mountpoint, Err: err}
	}
	bsize := uint64(st.Frsize)
	if bsize == 0 {
		bsize = uint64(st.Bsize)
	}
	return (st.Blocks - st.Bfree) * bsize, st.Blocks * bsize, nil
}
