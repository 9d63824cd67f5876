// Package treemove moves a directory tree into place, merging it into a
// directory already there: how a copied tree lands, on the caller's machine
// for a download (the CLI's `ws cp -r`) and in the guest for an upload
// (FileService.MoveFile with merge).
//
// Each entry moves by rename(2), so it is whole at its destination or
// still at its source, and a move cut short leaves no entry half written.
// An entry bound for another filesystem (a Volume mounted in the
// destination) is copied beside its destination under a temporary name
// and renamed over it once whole.
package treemove

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Move renames src to dst, except when both are directories (dst also
// through a symlink): then the entries of src are moved into dst, and src
// is removed once emptied. An entry that is a directory where dst holds a
// directory of its name (not a symlink to one) is merged into it the same
// way; any other entry replaces what dst holds under its name, as rename
// does: a file or symlink there is replaced, not followed, and an entry
// whose kind differs from a directory's there (a directory onto a file or
// symlink, a file onto a directory) makes the move fail. Move stops at the
// first entry that cannot be moved, with the entries before it moved.
//
// A directory moved onto itself changes nothing. One moved into a
// directory inside itself is refused (EINVAL), as rename refuses it, and
// so is one moved into a directory that holds it, when it has an entry of
// the name under which that directory holds it.
func Move(src, dst string) error {
	if !isDir(os.Lstat, src) || !isDir(os.Stat, dst) {
		return os.Rename(src, dst)
	}
	same, err := nested(src, dst)
	if err != nil || same {
		return err
	}
	return merge(src, dst)
}

// nested reports whether the directories src and dst are one, and refuses
// (EINVAL) a dst inside src, and a src inside dst that holds an entry its
// merge would move onto src or a directory holding it.
func nested(src, dst string) (same bool, err error) {
	s, err := filepath.EvalSymlinks(src)
	if err != nil {
		return false, err
	}
	d, err := filepath.EvalSymlinks(dst)
	if err != nil {
		return false, err
	}
	if s == d {
		return true, nil
	}
	if within(d, s) {
		return false, fmt.Errorf("merge %s into %s: the destination lies inside the source: %w", src, dst, syscall.EINVAL)
	}
	if within(s, d) {
		rel, _ := filepath.Rel(d, s)
		first, _, _ := strings.Cut(rel, string(filepath.Separator))
		if _, err := os.Lstat(filepath.Join(src, first)); err == nil {
			return false, fmt.Errorf("merge %s into %s: its entry %s would land on %s, which holds the source: %w",
				src, dst, first, filepath.Join(dst, first), syscall.EINVAL)
		}
	}
	return false, nil
}

// within reports whether path p lies inside directory dir; both are
// clean and absolute or both relative.
func within(p, dir string) bool {
	return strings.HasPrefix(p, dir+string(filepath.Separator)) || dir == string(filepath.Separator) && p != dir
}

// merge moves the entries of the directory src into the directory dst.
func merge(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if e.IsDir() && isDir(os.Lstat, to) {
			err = merge(from, to)
		} else if err = os.Rename(from, to); errors.Is(err, syscall.EXDEV) {
			err = copyAcross(from, to)
		}
		if err != nil {
			return err
		}
	}
	return os.Remove(src)
}

// copyAcross moves the entry from to to, which lies on another
// filesystem and is not a directory: a directory is made there and
// merged into, a file or symlink is copied under a temporary name beside
// to and renamed over it once whole. from is removed once moved. Its
// permission bits and modification time go with it; other kinds of file
// (devices, sockets, FIFOs) stay, refused as rename refused them.
func copyAcross(from, to string) error {
	st, err := os.Lstat(from)
	if err != nil {
		return err
	}
	mode := st.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	switch {
	case st.IsDir():
		if err := os.Mkdir(to, 0o700); err != nil {
			return err
		}
		if err := merge(from, to); err != nil {
			return err
		}
		if err := os.Chmod(to, mode); err != nil {
			return err
		}
		return os.Chtimes(to, st.ModTime(), st.ModTime())
	case st.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(from)
		if err != nil {
			return err
		}
		return replace(from, to, func(tmp string) error { return os.Symlink(target, tmp) })
	case st.Mode().IsRegular():
		return replace(from, to, func(tmp string) error { return copyFile(from, tmp, mode, st) })
	}
	return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EXDEV}
}

// replace makes a new entry with create under a temporary name beside to,
// renames it over to, and removes from.
func replace(from, to string, create func(tmp string) error) error {
	tmp := filepath.Join(filepath.Dir(to), ".kibotos-move-"+rand.Text())
	if err := create(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, to); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Remove(from)
}

// copyFile copies the regular file from, of metadata st, to the new file
// tmp, with mode and st's modification time.
func copyFile(from, tmp string, mode fs.FileMode, st fs.FileInfo) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Chmod(mode) // exactly: the umask took bits from the create
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Chtimes(tmp, st.ModTime(), st.ModTime())
}

// isDir reports whether stat says p is a directory.
func isDir(stat func(string) (fs.FileInfo, error), p string) bool {
	st, err := stat(p)
	return err == nil && st.IsDir()
}
