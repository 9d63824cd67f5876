package oci

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

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
