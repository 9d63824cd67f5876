package oci

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// mountsUnder returns the mount points at or below dir in mount order (a
// mount after the one it stands on); unmount them in reverse. Each call
// has the kernel print a line for every mount of this namespace, and a
// host running a thousand workspaces has thousands: read the table once
// for all of a directory (within picks parts of it).
func mountsUnder(dir string) ([]string, error) {
	// Compared as the kernel writes them: escaping each byte on its own
	// keeps equality and prefixes, so only the matches are decoded.
	esc := escapeMountinfo(dir)
	below := []byte(esc + "/")
	var pts []string
	err := scanMountinfo(func(line []byte) {
		if mp, ok := mountPointField(line); ok && (string(mp) == esc || bytes.HasPrefix(mp, below)) {
			pts = append(pts, unescapeMountinfo(string(mp)))
		}
	})
	return pts, err
}

// mountSource returns the source of the mount at mp (the last one, when
// mounts are stacked), if any.
func mountSource(mp string) string {
	esc, src := escapeMountinfo(mp), ""
	scanMountinfo(func(line []byte) {
		if p, ok := mountPointField(line); !ok || string(p) != esc {
			return
		}
		// The source is the second field after the optional fields'
		// separator.
		if _, after, ok := bytes.Cut(line, []byte(" - ")); ok {
			if f := bytes.Fields(after); len(f) >= 2 {
				src = unescapeMountinfo(string(f[1]))
			}
		}
	})
	return src
}

// scanMountinfo calls each with every line of this namespace's mount
// table; the line is valid only during the call.
func scanMountinfo(each func(line []byte)) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		each(sc.Bytes())
	}
	return sc.Err()
}

// within returns the mount points of pts at or below dir, in their order.
func within(pts []string, dir string) []string {
	var out []string
	for _, p := range pts {
		if isWithin(p, dir) {
			out = append(out, p)
		}
	}
	return out
}

// isWithin reports whether path is dir or below it.
func isWithin(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// mountPointField returns the mount point, the fifth field, of a line of
// mountinfo, still escaped.
func mountPointField(line []byte) ([]byte, bool) {
	for range 4 {
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			return nil, false
		}
		line = line[i+1:]
	}
	if i := bytes.IndexByte(line, ' '); i >= 0 {
		line = line[:i]
	}
	return line, len(line) > 0
}

// escapeMountinfo escapes a path as mountinfo does: space, tab, newline
// and backslash as three octal digits.
func escapeMountinfo(s string) string {
	if !strings.ContainsAny(s, " \t\n\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\\':
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
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

// unmountPoints unmounts pts, mount points in mount order, deepest first.
// A mount that is busy is detached lazily instead; plain is false then.
func unmountPoints(pts []string) (plain bool, err error) {
	pts = slices.Clone(pts)
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
	root, known, err := mountRoot(path)
	if err != nil {
		return false
	}
	if known {
		return root
	}
	pts, err := mountsUnder(path)
	return err == nil && slices.Contains(pts, path)
}

// mountRoot reports whether path is the root of a mount, as statx tells
// without reading the mount table; known is false where the kernel does
// not tell (before Linux 5.8).
func mountRoot(path string) (root, known bool, err error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, 0, &st); err != nil {
		return false, false, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, false, nil
	}
	return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, true, nil
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
