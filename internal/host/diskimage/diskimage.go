// Package diskimage manages ext4 image files for writable layers and
// volumes, and the loop devices that mount them.
//
// An image is a regular file holding an ext4 filesystem of exactly the
// file's size. Every change to one is made on a temporary sibling
// (".<name>.tmp-*") and renamed into place, so a crash at any moment
// leaves either the old image or the new one at its path; the next
// Create, Grow or Delete of that path removes the temporaries a crash
// left. Callers serialize the calls on one image.
package diskimage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
)

// MiB is the unit of image sizes: every size is a whole, positive number
// of MiB.
const MiB = 1 << 20

func checkSize(bytes uint64) error {
	if bytes == 0 || bytes%MiB != 0 || bytes > 1<<62 {
		return fmt.Errorf("diskimage: size %d is not a whole, positive number of MiB", bytes)
	}
	return nil
}

// Create creates an ext4 image of exactly bytes at path, unless a file
// exists there already (which is left untouched). uuid, when not empty,
// is the filesystem's UUID; otherwise mkfs picks a random one. The
// filesystem is owned by root, keeps no blocks reserved for root (the
// image is its user's own disk) and keeps its journal: it is what makes
// a forced stop recoverable. The image is built under a temporary name
// and renamed into place, so a crash never leaves a half-made image at
// path.
func Create(ctx context.Context, path string, bytes uint64, uuid string) error {
	return CreateFilled(ctx, path, bytes, uuid, nil, nil)
}

// CreateFilled is Create, and fill, when not nil, writes the new
// filesystem's content before the image is renamed into place: it is
// called with the temporary image mounted read-write at a directory of
// its own, which is unmounted after it returns. An error of fill leaves
// no image at path. like, when not nil, is the Geometry of the filesystem
// whose content fill writes, which the new one copies (as it keeps no
// journal without one), so that the content fits again; otherwise mkfs
// lays it out for its size.
func CreateFilled(ctx context.Context, path string, bytes uint64, uuid string, like *Geometry, fill func(dir string) error) error {
	if err := checkSize(bytes); err != nil {
		return err
	}
	args := []string{"-F", "-q", "-m", "0"}
	extended := "root_owner=0:0,lazy_journal_init=1"
	if like != nil {
		layout, more, err := like.mkfsArgs(bytes)
		if err != nil {
			return err
		}
		args = append(args, layout...)
		if more != "" {
			extended += "," + more
		}
	}
	args = append(args, "-E", extended)
	if uuid != "" {
		args = append(args, "-U", uuid)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	// A crash during an earlier call left its temporary image behind.
	if err := removeTemps(path); err != nil {
		return err
	}
	if _, err := os.Lstat(path); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := createTemp(path)
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Truncate(int64(bytes)); err != nil {
		return err
	}
	// The image is a new sparse file, whose holes read as zeros: the
	// journal need not be zeroed (lazy_journal_init), which otherwise took
	// 4 MiB of the host's disk for a 64 MiB image and 32 MiB for a 1 GiB
	// one (allocated as zeroed extents, at no measurable time).
	if err := run(ctx, "mkfs.ext4", append(args, tmp)...); err != nil {
		return err
	}
	if fill != nil {
		if err := fillImage(tmp, fill); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return syncDir(filepath.Dir(path))
}

// Grow grows the image at path and its filesystem to bytes, offline; an
// image (and filesystem) already at least that large is left alone. An
// image attached to a loop device is refused: it is in use.
//
// The work is done on a copy (a reflink where the filesystem under path
// can make one, a sparse copy otherwise): check it, extend it, resize2fs
// it, sync it, and rename it over path. A crash or a kill at any moment
// leaves at path either the old image or the grown one, never a
// half-grown one. Without reflinks the copy needs room for the image's
// data a second time while Grow runs.
func Grow(ctx context.Context, path string, bytes uint64) error {
	if err := checkSize(bytes); err != nil {
		return err
	}
	if err := removeTemps(path); err != nil {
		return err
	}
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("diskimage: %s is not a regular file", path)
	}
	if uint64(fi.Size()) >= bytes {
		// A file that an interrupted GrowOnline extended may hold a smaller
		// filesystem: that one still grows, to the file's size.
		sb, err := readSuper(src)
		if err != nil {
			return fmt.Errorf("diskimage: %s: %w", path, err)
		}
		if sb.bytes() >= bytes {
			return nil
		}
		bytes = uint64(fi.Size())
	}
	if err := inUse(path); err != nil {
		return err
	}
	dst, err := createTemp(path)
	if err != nil {
		return err
	}
	tmp := dst.Name()
	ok := false
	defer func() {
		if !ok {
			dst.Close()
			os.Remove(tmp)
		}
	}()
	if err := copyImage(ctx, dst, src, fi.Size()); err != nil {
		return fmt.Errorf("diskimage: copying %s: %w", path, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if err := dst.Chown(int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := dst.Chmod(fi.Mode().Perm()); err != nil {
		return err
	}
	// resize2fs wants a freshly checked filesystem; e2fsck -p exits 1 when
	// it corrected something, which is fine.
	if err := run(ctx, "e2fsck", "-f", "-p", tmp); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			return err
		}
	}
	if err := dst.Truncate(int64(bytes)); err != nil {
		return err
	}
	if err := run(ctx, "resize2fs", tmp); err != nil {
		return err
	}
	if err := dst.Sync(); err != nil {
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	// Attached meanwhile (the caller broke the rules): a device would keep
	// writing to the old inode, and those writes would be lost.
	if err := inUse(path); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return syncDir(filepath.Dir(path))
}

// Delete removes the image at path and the temporaries a crash left;
// a missing image is fine. An image attached to a loop device is refused:
// it is in use.
func Delete(path string) error {
	if err := inUse(path); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return removeTemps(path)
}

// tempPattern is the name pattern of path's temporary images.
func tempPattern(path string) string { return "." + filepath.Base(path) + ".tmp-*" }

func createTemp(path string) (*os.File, error) {
	return os.CreateTemp(filepath.Dir(path), tempPattern(path))
}

// removeTemps removes the temporary images of path that an interrupted
// call left. Callers serialize the calls on one image, so none is in use.
func removeTemps(path string) error {
	temps, err := filepath.Glob(filepath.Join(filepath.Dir(path), tempPattern(path)))
	if err != nil {
		return err
	}
	for _, t := range temps {
		if err := os.Remove(t); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// run runs a tool of e2fsprogs, returning its output with a failure. The
// tool is killed when the calling process dies: it must not go on
// writing to a temporary image that the next call removes.
func run(ctx context.Context, tool string, args ...string) error {
	bin, err := LookPath(tool)
	if err != nil {
		return fmt.Errorf("diskimage: %s: %w", tool, err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The death signal follows the thread that started the tool: keep
	// this goroutine on it, so that the thread cannot end first.
	goruntime.LockOSThread()
	err = cmd.Run()
	goruntime.UnlockOSThread()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("diskimage: %s: %w", tool, ctx.Err())
		}
		return fmt.Errorf("diskimage: %s: %w: %s", tool, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// LookPath finds a host tool (e2fsprogs here, the OCI runtime for the
// driver) in PATH or, since daemons often run with a short PATH, in the
// sbin directories.
func LookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/local/bin", "/usr/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
