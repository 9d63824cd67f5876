package oci

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// consoleLogBytes bounds the console log of an execution: the standard
// output and error of its PID 1, which the guest can write to at will
// (/proc/1/fd/1). The log lives on a tmpfs of this size of its own, so
// that what the guest writes there costs its own memory (tmpfs pages are
// charged to the writer's cgroup), never the host's disk; writes past it
// fail with ENOSPC and the start of the log, where the agent's start-up
// and any failure of the runtime are, is kept.
const consoleLogBytes = 1 << 20

// consoleDir is the console log's tmpfs in an execution's directory.
func consoleDir(dir string) string { return filepath.Join(dir, "console") }

// consoleLog is the console log of the execution whose directory is dir.
func consoleLog(dir string) string { return filepath.Join(consoleDir(dir), "console.log") }

// mountConsole mounts the console log's tmpfs; release unmounts it with
// the rest of the execution's directory.
func mountConsole(dir string) error {
	cd := consoleDir(dir)
	if err := os.MkdirAll(cd, 0o700); err != nil {
		return err
	}
	opts := "size=" + strconv.Itoa(consoleLogBytes) + ",nr_inodes=8,mode=0700"
	if err := unix.Mount("tmpfs", cd, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("oci: console log: %w", err)
	}
	return nil
}
