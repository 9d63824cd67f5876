package oci

import (
	"errors"
	"fmt"
	"os"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// prepareMountPoints makes the mount points of mounts in the guest's
// rootfs (mounted on the host at rootfs) real directories, or empty files
// for files bound in, before the runtime mounts anything. The rootfs is
// the guest's to write: a link the guest left at a mount point (a volume's
// path linked to the agent's socket directory, /etc/resolv.conf linked to
// the agent) would otherwise be followed by the runtime, and the mount
// would land elsewhere in the guest. A link or other file at the last
// component is replaced, since the mount replaces what is there anyway.
// On the way to the platform's own mount points (/.kibotos, /etc/...) a
// link or file is replaced too: those paths are reserved. On the way to
// the volume's mount point (volumePath), which lies among the user's
// files, it is refused, since replacing it would destroy more of them
// than the mount hides. Mount points below another mount of the list are
// on that mount (a fresh tmpfs) and are left to the runtime.
func prepareMountPoints(rootfs string, mounts []specs.Mount, volumePath string) error {
	var done []string
	for _, m := range mounts {
		if under(m.Destination, done) {
			continue
		}
		done = append(done, m.Destination)
		file := false
		if m.Type == "bind" {
			if fi, err := os.Stat(m.Source); err == nil && !fi.IsDir() {
				file = true
			}
		}
		replaceParents := m.Destination != volumePath
		if err := prepareMountPoint(rootfs, m.Destination, file, replaceParents); err != nil {
			return fmt.Errorf("oci: mount point %s in the guest: %w", m.Destination, err)
		}
	}
	return nil
}

// under reports whether p is at or below one of dirs.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// errNotDirectory is why a mount point cannot be prepared.
var errNotDirectory = errors.New("a parent is a symbolic link or not a directory in the guest's filesystem; the platform mounts only below real directories")

// prepareMountPoint walks the clean, absolute guest path p below rootfs
// without following any link, creating missing directories (and with
// replaceParents, replacing what is not one), and leaves a directory (or
// with file, a regular file) at its end.
func prepareMountPoint(rootfs, p string, file, replaceParents bool) error {
	dir, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer func() { unix.Close(dir) }()
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for _, name := range parts[:len(parts)-1] {
		if replaceParents {
			if err := makeEntry(dir, name, false); err != nil {
				return err
			}
		} else if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return errNotDirectory
		}
		if err != nil {
			return err
		}
		unix.Close(dir)
		dir = next
	}
	return makeEntry(dir, parts[len(parts)-1], file)
}

// makeEntry leaves a directory (with file, a regular file) at name in
// dir: what is there already is kept, anything else removed first.
func makeEntry(dir int, name string, file bool) error {
	var st unix.Stat_t
	err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && !file && st.Mode&unix.S_IFMT == unix.S_IFDIR,
		err == nil && file && st.Mode&unix.S_IFMT == unix.S_IFREG:
		return nil
	case err == nil:
		// What the guest left: removed (an empty directory in place of a
		// file goes too), so that the mount point is what it must be.
		flags := 0
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			flags = unix.AT_REMOVEDIR
		}
		if err := unix.Unlinkat(dir, name, flags); err != nil {
			return fmt.Errorf("replacing what the guest left there: %w", err)
		}
	case !errors.Is(err, unix.ENOENT):
		return err
	}
	if !file {
		return unix.Mkdirat(dir, name, 0o755)
	}
	fd, err := unix.Openat(dir, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}
