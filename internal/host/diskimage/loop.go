package diskimage

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// loopReadAhead is the most a loop device reads ahead, in bytes.
const loopReadAhead = 1 << 20

// AttachLoop binds image to a free loop device with autoclear set and
// returns the device's path and an open descriptor of it. The caller
// must keep the descriptor open until the device is mounted: autoclear
// detaches the device when its last user closes it, which is also what
// releases a device whose mount never happened.
//
// The device does direct I/O on the image where the image's filesystem
// allows it: a page the guest's filesystem caches is not cached a second
// time as a page of the image on the host, and its writes skip that copy
// (a 1 GiB write and fsync in a guest took 1.7 times less time). It reads
// ahead up to loopReadAhead.
func AttachLoop(image string) (string, *os.File, error) {
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
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:], image)
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if errors.Is(err, unix.EINVAL) {
			// A kernel or filesystem that cannot do direct I/O on the image.
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		}
		if err == nil {
			// The kernel's default of 128 KiB made a file read from disk
			// a string of small reads through the loop device, each a
			// read of the image: 1 MiB, the size of the data plane's
			// reads, takes about a fifth less time per GiB. Readahead
			// still starts small and grows only for sequential reads.
			if err := unix.IoctlSetInt(int(dev.Fd()), unix.BLKRASET, loopReadAhead/512); err != nil {
				slog.Warn("setting a loop device's readahead; keeping the kernel's", "device", path, "err", err)
			}
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
		if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(loopMajor, uint32(n)))); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	return f, err
}

// LoopsOf returns the loop devices (/dev/loopN) whose backing file is
// image, found through sysfs by path, or by inode where the path names a
// file of the image's name (a hard link of another name is not found). Only the devices that
// have a backing file are read (boundLoops): a host keeps every loop
// device it ever used, and reading the sysfs entry of each unbound one
// made most of a scan's cost.
func LoopsOf(image string) []string {
	return newLoopMatcher(image).scan()
}

// loopMatcher tells the loop devices bound to one image.
type loopMatcher struct {
	abs      string
	want     unix.Stat_t
	haveStat bool
}

func newLoopMatcher(image string) *loopMatcher {
	m := new(loopMatcher)
	m.abs, _ = filepath.Abs(image)
	m.haveStat = unix.Stat(image, &m.want) == nil
	return m
}

// scan returns every loop device bound to the image.
func (m *loopMatcher) scan() []string {
	var devs []string
	for _, name := range boundLoops() {
		if m.bound("/dev/" + name) {
			devs = append(devs, "/dev/"+name)
		}
	}
	return devs
}

// bound reports whether the loop device dev is bound to the image.
func (m *loopMatcher) bound(dev string) bool {
	backing, err := BackingFile(dev)
	if err != nil {
		return false
	}
	// The kernel names the file by its current path in this namespace.
	// Another spelling of that path (through a symbolic link, or another
	// mount of the same filesystem) keeps the file's name: only then is
	// the inode compared, which spares a lookup of every other bound
	// device's file.
	if backing == m.abs {
		return true
	}
	if !m.haveStat || filepath.Base(backing) != filepath.Base(m.abs) {
		return false
	}
	var st unix.Stat_t
	return unix.Stat(backing, &st) == nil && st.Dev == m.want.Dev && st.Ino == m.want.Ino
}

// boundLoops returns the names (loopN) of the loop devices that may have a
// backing file: those /proc/partitions lists, since the kernel leaves a
// device without capacity out of it and an unbound loop device has none.
// (A device bound to an empty file has none either; no image is empty.)
// Without /proc/partitions it returns every loop device in /sys/block.
func boundLoops() []string {
	var names []string
	if b, err := os.ReadFile("/proc/partitions"); err == nil {
		major := strconv.Itoa(loopMajor)
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) == 4 && f[0] == major && isLoopName(f[3]) {
				names = append(names, f[3])
			}
		}
		return names
	}
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		if isLoopName(e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names
}

// loopMajor is the block major number of loop devices.
const loopMajor = 7

// isLoopName tells a loop device's name (loopN) from others, a partition
// of one (loopNpM) included.
func isLoopName(name string) bool {
	n, ok := strings.CutPrefix(name, "loop")
	if !ok || n == "" {
		return false
	}
	_, err := strconv.ParseUint(n, 10, 32)
	return err == nil
}

// BackingFile returns the path of the file the loop device /dev/loopN is
// bound to (as the kernel recorded it when binding, without the
// " (deleted)" it adds once that file is removed); an error when the
// device is not bound.
//
// A scan (LoopsOf) reads this for every bound device, so it is read with
// one open, one read and one close: os.ReadFile adds two fstats, a second
// read and the file's bookkeeping, and a host running a thousand
// workspaces has a thousand bound devices.
func BackingFile(dev string) (string, error) {
	fd, err := unix.Open("/sys/block/"+filepath.Base(dev)+"/loop/backing_file", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", &os.PathError{Op: "open", Path: dev, Err: err}
	}
	defer unix.Close(fd)
	// The kernel prints the attribute in one go, at most a page.
	var buf [4096]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil {
		return "", &os.PathError{Op: "read", Path: dev, Err: err}
	}
	return strings.TrimSuffix(strings.TrimSpace(string(buf[:n])), " (deleted)"), nil
}

// inUse returns an error naming the loop devices image is attached to,
// nil when there are none.
func inUse(image string) error {
	if devs := LoopsOf(image); len(devs) > 0 {
		return fmt.Errorf("diskimage: %s is in use by %s", image, strings.Join(devs, ", "))
	}
	return nil
}

// detachLoop clears a loop device. A device still in use is marked
// autoclear by the kernel instead, so the caller looks again (LoopsOf).
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

// WaitLoopsReleased waits up to d for every loop device bound to image to
// detach (autoclear runs when the last reference to the filesystem goes,
// which can trail the unmount while a dying mount namespace lets go of
// it), clearing them explicitly in the end. It reports whether none is
// left.
//
// It looks again every 5 ms at the devices it found bound, not at every
// bound device of the host: on a host of many workspaces a scan reads
// each one's backing file, and the releases of a burst of deletions each
// polled that way. Once they are released, it scans again, and it
// returns only on a scan that finds none. A scan lists the bound devices
// first and reads their backing files after, so one that found none may
// have missed a device bound while it read (listed too late, while the
// one it followed let go): a scan that starts after it lists that one.
func WaitLoopsReleased(image string, d time.Duration) bool {
	m := newLoopMatcher(image)
	deadline := time.Now().Add(d)
	devs := m.scan()
	for {
		for len(devs) > 0 {
			if time.Now().After(deadline) {
				for _, dev := range devs {
					detachLoop(dev)
				}
				return len(m.scan()) == 0
			}
			time.Sleep(5 * time.Millisecond)
			devs = slices.DeleteFunc(devs, func(dev string) bool { return !m.bound(dev) })
		}
		if devs = m.scan(); len(devs) == 0 {
			return true
		}
	}
}

// Holders names the processes, one per mount namespace, whose mount
// tables hold a filesystem of the loop devices bound to image ("pid 812
// (sleep)"): a namespace made while the image was mounted (unshare -m,
// say) keeps a copy of its mount, and so the device, until it ends. At
// most max are named.
func Holders(image string, max int) []string {
	var want []string // maj:min of the devices
	for _, dev := range LoopsOf(image) {
		var st unix.Stat_t
		if unix.Stat(dev, &st) == nil {
			want = append(want, fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
		}
	}
	if len(want) == 0 {
		return nil
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	seen := map[string]bool{} // mount namespaces named
	var holders []string
	for _, proc := range procs {
		if len(holders) == max {
			break
		}
		ns, err := os.Readlink(proc + "/ns/mnt")
		if err != nil || seen[ns] {
			continue
		}
		info, err := os.ReadFile(proc + "/mountinfo")
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(info)) {
			if f := strings.Fields(line); len(f) > 2 && slices.Contains(want, f[2]) {
				seen[ns] = true
				comm, _ := os.ReadFile(proc + "/comm")
				holders = append(holders, fmt.Sprintf("pid %s (%s)", filepath.Base(proc), strings.TrimSpace(string(comm))))
				break
			}
		}
	}
	return holders
}
