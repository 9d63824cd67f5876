package diskimage

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Reserve allocates on the host's filesystem every block of the image at
// path that it does not hold yet, so that no write into the image can
// fail for want of room on the host. An image is sparse until then: a
// block is taken only when its guest first writes it, and a host disk
// filled meanwhile by anything else would fail that write on the host,
// where the guest's filesystem sees an I/O error and aborts its journal.
// The blocks are allocated unwritten (they read as zeros and cost no
// write), and the image keeps them until it is deleted: nothing in the
// guest discards them.
//
// The error wraps ENOSPC, saying how much is missing, when the host's
// filesystem cannot hold the image; a filesystem that cannot allocate
// ahead leaves the image sparse, and that is no error.
func Reserve(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	size, held := uint64(st.Size), uint64(st.Blocks)*512
	if held >= size {
		return nil
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, int64(size))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EOPNOTSUPP):
		return nil
	case errors.Is(err, unix.ENOSPC):
		var fs unix.Statfs_t
		unix.Fstatfs(int(f.Fd()), &fs)
		return fmt.Errorf("the host's disk has %d MiB free, too little to hold all %d MiB of the image (%d MiB of it held): %w",
			fs.Bavail*uint64(fs.Bsize)>>20, size>>20, held>>20, err)
	}
	return fmt.Errorf("diskimage: reserving %s: %w", path, err)
}
