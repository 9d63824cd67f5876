// Package treemove moves a directory tree into place, merging it into a
// directory already there: how a copied tree lands, on the caller's machine
// for a download (the CLI's `ws cp -r`) and in the guest for an upload
// (FileService.MoveFile with merge).
//
// Each entry moves by rename(2), so it is whole at its destination or
// still at its source, and a move cut short leaves no entry half written.
package treemove

import (
	"io/fs"
	"os"
	"path/filepath"
)

// Move renames src to dst, except when both are directories (dst also
// through a symlink): then the entries of src are moved into dst, and src
// is removed once emptied. An entry that is a directory where dst holds a
// directory of its name (not a symlink to one) is merged into it the same
// way; any other entry replaces what dst holds under its name, as rename
// does: a file or symlink there is replaced, not followed, and a
// directory there makes the move fail. Move stops at the first entry that
// cannot be moved, with the entries before it moved.
func Move(src, dst string) error {
	if isDir(os.Lstat, src) && isDir(os.Stat, dst) {
		return merge(src, dst)
	}
	return os.Rename(src, dst)
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
		} else {
			err = os.Rename(from, to)
		}
		if err != nil {
			return err
		}
	}
	return os.Remove(src)
}

// isDir reports whether stat says p is a directory.
func isDir(stat func(string) (fs.FileInfo, error), p string) bool {
	st, err := stat(p)
	return err == nil && st.IsDir()
}
