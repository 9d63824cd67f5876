package oci

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// attachLoop binds image to a free loop device with autoclear set and
// returns the device's path and an open descriptor of it. The caller
// must keep the descriptor open until the device is mounted: autoclear
// detaches the device when its last user closes it, which is also what
// releases a device whose mount never happened.
func attachLoop(image string) (string, *os.File, error) {
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	defer ctl.Close()
	for attempt := 0; attempt < 20; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		path := "/dev/loop" + strconv.Itoa(n)
		dev, err := openLoopDev(path, n)
		if err != nil {
			return "", nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], image)
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return path, dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("LOOP_CONFIGURE %s: %w", path, err)
		}
		// Another process took the free device first: ask again.
		time.Sleep(time.Duration(attempt+1) * time.Millisecond)
	}
	return "", nil, errors.New("no free loop device")
}

// openLoopDev opens /dev/loopN, creating the node when the host's /dev
// does not create it (a /dev that is not devtmpfs).
func openLoopDev(path string, n int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	return f, err
}

// loopsOf returns the loop devices (/dev/loopN) whose backing file is
// image, found through sysfs by path or by inode.
func loopsOf(image string) []string {
	abs, _ := filepath.Abs(image)
	var want unix.Stat_t
	haveStat := unix.Stat(image, &want) == nil
	ents, _ := os.ReadDir("/sys/block")
	var devs []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue
		}
		backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		match := backing == abs
		if !match && haveStat {
			var st unix.Stat_t
			match = unix.Stat(backing, &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino
		}
		if match {
			devs = append(devs, "/dev/"+e.Name())
		}
	}
	return devs
}

// loopBound reports whether the loop device /dev/loopN still has a
// backing file.
func loopBound(dev string) bool {
	_, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	return err == nil
}

// detachLoop clears a loop device. A device still in use is marked
// autoclear by the kernel instead, so the caller checks loopBound.
func detachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
	if errors.Is(err, unix.ENXIO) {
		return nil // not bound
	}
	return err
}

// waitLoopsReleased waits up to d for every loop device bound to image to
// detach (autoclear runs when the last reference to the filesystem goes,
// which can trail the unmount while a dying mount namespace lets go of
// it), clearing them explicitly in the end. It reports whether none is
// left.
func waitLoopsReleased(image string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		devs := loopsOf(image)
		if len(devs) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			for _, dev := range devs {
				detachLoop(dev)
			}
			return len(loopsOf(image)) == 0
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mountsUnder returns the mount points at or below dir, deepest last in
// mount order; unmount them in reverse.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var pts []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			pts = append(pts, mp)
		}
	}
	return pts, sc.Err()
}

// unescapeMountinfo decodes the octal escapes (\040 for a space, ...) of
// a mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts every mount at or below dir, deepest first. A
// mount that stays busy is detached (MNT_DETACH) instead; plain reports
// whether every unmount was a plain one.
func unmountAll(dir string) (plain bool, err error) {
	pts, err := mountsUnder(dir)
	if err != nil {
		return false, err
	}
	sort.SliceStable(pts, func(i, j int) bool { return len(pts[i]) > len(pts[j]) })
	plain = true
	for _, mp := range pts {
		if e := unmount(mp); e != nil {
			plain = false
			if e := unix.Unmount(mp, unix.MNT_DETACH); e != nil && !errors.Is(e, unix.EINVAL) && !errors.Is(e, unix.ENOENT) {
				err = errors.Join(err, fmt.Errorf("unmount %s: %w", mp, e))
			}
		}
	}
	return plain, err
}

// unmount unmounts mp plainly, retrying a few times while it is busy; a
// mount point that is not mounted is not an error.
func unmount(mp string) error {
	var err error
	for i := 0; i < 10; i++ {
		err = unix.Unmount(mp, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(time.Duration(i+1) * 5 * time.Millisecond)
	}
	return fmt.Errorf("unmount %s: %w", mp, err)
}

// isMountPoint reports whether path is a mount point of this namespace.
func isMountPoint(path string) bool {
	pts, err := mountsUnder(path)
	if err != nil {
		return false
	}
	for _, p := range pts {
		if p == path {
			return true
		}
	}
	return false
}

// syncfs flushes the filesystem that holds path.
func syncfs(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
