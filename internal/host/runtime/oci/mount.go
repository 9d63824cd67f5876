package oci

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/diskimage"
	"github.com/kibotos/kibotos/internal/host/mountinfo"
)

// mountsUnder returns the mount points at or below dir in mount order (a
// mount after the one it stands on); unmount them in reverse. Each call
// has the kernel print a line for every mount of this namespace, and a
// host running a thousand workspaces has thousands: read the table once
// for all of a directory (within picks parts of it).
func mountsUnder(dir string) ([]string, error) {
	// Compared as the kernel writes them: escaping each byte on its own
	// keeps equality and prefixes, so only the matches are decoded.
	esc := mountinfo.Escape(dir)
	below := []byte(esc + "/")
	var pts []string
	err := mountinfo.Scan(func(line []byte) {
		if mp, ok := mountinfo.MountPoint(line); ok && (string(mp) == esc || bytes.HasPrefix(mp, below)) {
			pts = append(pts, mountinfo.Unescape(string(mp)))
		}
	})
	return pts, err
}

// mountSource returns the source of the mount at mp (the last one, when
// mounts are stacked), if any.
func mountSource(mp string) string {
	esc, src := mountinfo.Escape(mp), ""
	mountinfo.Scan(func(line []byte) {
		if p, ok := mountinfo.MountPoint(line); !ok || string(p) != esc {
			return
		}
		if s, ok := mountinfo.Source(line); ok {
			src = mountinfo.Unescape(string(s))
		}
	})
	return src
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

// unmountPoints unmounts pts, mount points in mount order, deepest first.
// A mount that is busy is detached lazily instead; plain is false then.
func unmountPoints(pts []string) (plain bool, err error) {
	pts = slices.Clone(pts)
	sort.SliceStable(pts, func(i, j int) bool { return len(pts[i]) > len(pts[j]) })
	plain = true
	for _, mp := range pts {
		detached, e := diskimage.Unmount(mp, unmountBusyFor)
		if detached || e != nil {
			plain = false
		}
		err = errors.Join(err, e)
	}
	return plain, err
}

// unmountBusyFor is how long a busy mount point of an execution is tried
// again before it is detached.
const unmountBusyFor = 275 * time.Millisecond

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
