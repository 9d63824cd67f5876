package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/runtime"
)

var _ runtime.Binder = (*Driver)(nil)

// Bind hands a running execution to a workspace; see runtime.Binder. The
// layer image is renamed (the loop device follows its inode) and the
// record names the new path before anything else changes; the limits are
// written to the execution's cgroups, and the hostname is set in the
// execution's UTS namespace from a thread of this process that joins it,
// since the guest has no right to set it itself.
func (d *Driver) Bind(ctx context.Context, id string, b runtime.Binding) (err error) {
	if err := checkID(id); err != nil {
		return err
	}
	defer d.lock(id)()
	defer func() { err = d.public(err, id, nil) }()
	if err := ctx.Err(); err != nil {
		return err
	}
	rec, err := d.readRecord(id)
	if errors.Is(err, os.ErrNotExist) {
		return runtime.ErrNotFound
	} else if err != nil {
		return err
	}
	image, err := filepath.Abs(b.LayerImage)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(image); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("oci: binding %s: layer image %s exists", id, image)
	}
	old := rec.LayerImage
	if err := os.Rename(old, image); err != nil {
		return fmt.Errorf("oci: binding %s: %w", id, err)
	}
	rec.LayerImage = image
	if err := d.writeRecord(rec); err != nil {
		return errors.Join(err, os.Rename(image, old))
	}
	if err := setCgroupLimits(id, b); err != nil {
		return fmt.Errorf("oci: binding %s: limits: %w", id, err)
	}
	pid, err := cgroupPID(id)
	if err != nil {
		return fmt.Errorf("oci: binding %s: %w", id, err)
	}
	if err := setHostname(pid, b.Hostname); err != nil {
		return fmt.Errorf("oci: binding %s: hostname: %w", id, err)
	}
	if err := writeIdentity(rec.SocketDir, b.Hostname); err != nil {
		return fmt.Errorf("oci: binding %s: %w", id, err)
	}
	return nil
}

// setCgroupLimits writes b's limits to the execution's cgroups as the
// runtime's update would: memory (swap included), the CFS quota
// (setCgroupCPU) and the pids limit, each on the v1 controller's hierarchy
// where it exists, else on the cgroup2 tree.
func setCgroupLimits(id string, b runtime.Binding) error {
	if b.MemoryBytes > 0 {
		if err := setCgroupMemory(id, b.MemoryBytes); err != nil {
			return err
		}
	}
	if err := setCgroupCPU(id, b.CPUMillis); err != nil {
		return err
	}
	pids := "max"
	if b.PidsLimit > 0 {
		pids = strconv.FormatInt(b.PidsLimit, 10)
	}
	cg := cgroupPath(id)
	return writeCgroup(filepath.Join(cgroupRoot, "pids", cg, "pids.max"), pids,
		filepath.Join(cgroupRoot, cg, "pids.max"), pids)
}

// writeCgroup writes v1 to the v1 file when its hierarchy has the
// execution's cgroup, else v2 to the cgroup2 file.
func writeCgroup(v1File, v1, v2File, v2 string) error {
	if _, err := os.Stat(filepath.Dir(v1File)); err == nil {
		return os.WriteFile(v1File, []byte(v1), 0)
	}
	return os.WriteFile(v2File, []byte(v2), 0)
}

// cgroupPID returns a process of the execution's cgroup: every process
// of it shares the execution's namespaces (the guest cannot make new ones).
func cgroupPID(id string) (int, error) {
	for _, dir := range cgroupDirs(id) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		if pid, err := strconv.Atoi(first); err == nil && pid > 0 {
			return pid, nil
		}
	}
	return 0, errors.New("no process in the execution's cgroups")
}

// setHostname sets the hostname of the UTS namespace of pid from a
// thread that joins it and then returns to its own; a thread that cannot
// return ends with its goroutine.
func setHostname(pid int, name string) error {
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/uts", pid))
	if err != nil {
		return err
	}
	defer target.Close()
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/uts")
		if err != nil {
			done <- err
			return
		}
		defer home.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWUTS); err != nil {
			done <- err
			return
		}
		err = unix.Sethostname([]byte(name))
		if restore := unix.Setns(int(home.Fd()), unix.CLONE_NEWUTS); restore != nil {
			done <- errors.Join(err, restore)
			return
		}
		goruntime.UnlockOSThread()
		done <- err
	}()
	return <-done
}
