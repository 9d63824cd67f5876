package diskimage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MountPrefix starts the name of every directory Mount creates, so that a
// host can find (and release) the mounts a crash left.
const MountPrefix = ".mnt-"

// Mount mounts the ext4 image at a new directory below parent, read-only
// when readOnly (a journal left by an unclean stop is still replayed: the
// loop device itself is writable), and returns the directory and the
// function that unmounts it and removes the directory. The image must not
// be in use.
func Mount(image, parent string, readOnly bool) (dir string, unmount func() error, err error) {
	if err := inUse(image); err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", nil, err
	}
	dir, err = os.MkdirTemp(parent, MountPrefix+filepath.Base(image)+"-")
	if err != nil {
		return "", nil, err
	}
	dev, f, err := AttachLoop(image)
	if err != nil {
		os.Remove(dir)
		return "", nil, err
	}
	var flags uintptr = unix.MS_NODEV | unix.MS_NOSUID
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	err = unix.Mount(dev, dir, "ext4", flags, "")
	f.Close() // the mount holds the device now; without one, autoclear frees it
	if err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("diskimage: mounting %s: %w", image, err)
	}
	return dir, func() error { return unmountDir(dir, image, readOnly) }, nil
}

// unmountBusyFor is how long unmountDir tries again a mount still busy: a
// reader that just ended may still be closing its files.
const unmountBusyFor = 2 * time.Second

// Unmount unmounts mp, trying again while it is busy for up to busyFor (a
// process that just ended may still be closing its files; another mount
// namespace may hold a copy for a moment), and detaches it when a plain
// unmount still fails, so that it goes once what holds it lets go:
// detached reports that. A mount point that is not mounted is no error;
// err is set only when mp could be neither unmounted nor detached.
func Unmount(mp string, busyFor time.Duration) (detached bool, err error) {
	deadline := time.Now().Add(busyFor)
	for wait := 5 * time.Millisecond; ; wait += 5 * time.Millisecond {
		err = unix.Unmount(mp, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().Add(wait).After(deadline) {
			break
		}
		time.Sleep(wait)
	}
	if e := unix.Unmount(mp, unix.MNT_DETACH); e != nil && !errors.Is(e, unix.EINVAL) && !errors.Is(e, unix.ENOENT) {
		return false, fmt.Errorf("unmounting %s: %w", mp, errors.Join(err, e))
	}
	return true, nil
}

// unmountDir unmounts a directory Mount made, waits for the image's loop
// device to go, and removes the directory. A mount still busy after
// unmountBusyFor is detached (Unmount), and goes once what holds it lets
// go: a read-only one loses nothing, while a writable one is an error all
// the same, as its writes may not all be on the image, but leaves no
// mount behind.
func unmountDir(dir, image string, readOnly bool) error {
	// This filesystem's writes only: a sync of every filesystem would
	// wait for the whole host's.
	if fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		err = unix.Syncfs(fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("diskimage: syncing %s: %w", dir, err)
		}
	}
	detached, err := Unmount(dir, unmountBusyFor)
	if err != nil {
		return fmt.Errorf("diskimage: %w", err)
	}
	if detached && !readOnly {
		os.Remove(dir)
		return fmt.Errorf("diskimage: unmounting %s: %w (detached: it goes once its holder lets go; the image is not to be used until then)", dir, unix.EBUSY)
	}
	if image != "" && !WaitLoopsReleased(image, 10*time.Second) {
		return fmt.Errorf("diskimage: %s is still attached after unmounting", image)
	}
	return os.Remove(dir)
}

// ReleaseMounts unmounts (lazily, whatever holds them) and removes the
// directories below parent that Mount made and a crash left.
func ReleaseMounts(parent string) error {
	ents, err := os.ReadDir(parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), MountPrefix) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// fillImage mounts a new image read-write beside it, lets fill write its
// content, and unmounts it.
func fillImage(image string, fill func(dir string) error) error {
	dir, unmount, err := Mount(image, filepath.Dir(image), false)
	if err != nil {
		return err
	}
	err = fill(dir)
	if uerr := unmount(); err == nil {
		err = uerr
	}
	return err
}
