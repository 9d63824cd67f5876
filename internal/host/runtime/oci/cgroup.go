package oci

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/psi"
)

const cgroupRoot = "/sys/fs/cgroup"

// oomKills returns how many processes the memory limit of the execution's
// cgroup has killed: memory.oom_control's oom_kill on cgroup v1, or
// memory.events' oom_kill on cgroup v2. ok is false when the cgroup is
// gone.
func oomKills(id string) (n uint64, ok bool) {
	var f cgroupFile
	defer f.close()
	f.read(oomKillFiles(id), func(b []byte) bool {
		n, ok = oomKillCount(b)
		return ok
	})
	return n, ok
}

// oomKillFiles are the files that may count the kills of the execution's
// memory limit, in the order oomKills tries them.
func oomKillFiles(id string) []string {
	cg := cgroupPath(id)
	return []string{
		filepath.Join(cgroupRoot, "memory", cg, "memory.oom_control"),
		filepath.Join(cgroupRoot, cg, "memory.events"),
	}
}

// oomKillCount reads the oom_kill count of one of oomKillFiles' contents.
func oomKillCount(data []byte) (uint64, bool) { return keyValue(data, "oom_kill") }

// setCgroupCPU writes the CFS quota of millis thousandths of a core (no
// quota for 0, as at start) to the execution's cgroup, with a burst of
// one period's quota: a guest that left its quota unused may spend that
// much more in a period, so a short command after idling (an exec, with
// the guest agent's own work for it) is not throttled for the rest of
// the period, while over time the guest still gets its quota and no more.
// The kernel refuses a burst above the quota, so the burst is cleared
// before the quota changes and set after.
func setCgroupCPU(id string, millis uint32) error {
	dir, v1 := cpuCgroup(id)
	quota, burst := "-1", "0"
	if millis > 0 {
		quota = strconv.FormatInt(int64(millis)*cfsPeriod/1000, 10)
		burst = quota
	}
	quotaFile, burstFile := "cpu.cfs_quota_us", "cpu.cfs_burst_us"
	if !v1 {
		quotaFile, burstFile = "cpu.max", "cpu.max.burst"
		if millis == 0 {
			quota = "max"
		}
		quota += " " + strconv.Itoa(cfsPeriod)
	}
	// A kernel before 5.14 has no burst file.
	setBurst := func(v string) error {
		path := filepath.Join(dir, burstFile)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return os.WriteFile(path, []byte(v), 0)
	}
	if err := setBurst("0"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, quotaFile), []byte(quota), 0); err != nil {
		return err
	}
	return setBurst(burst)
}

// cpuCgroup returns the directory of the execution's cgroup that holds
// its CPU controller's files: on cgroup v1's cpu hierarchy when it has the
// execution's cgroup (v1 is true), else on the cgroup2 tree.
func cpuCgroup(id string) (dir string, v1 bool) {
	dir = filepath.Join(cgroupRoot, "cpu", cgroupPath(id))
	if _, err := os.Stat(dir); err == nil {
		return dir, true
	}
	return filepath.Join(cgroupRoot, cgroupPath(id)), false
}

// setCgroupMemory sets the memory limit of the execution's cgroup to
// bytes, swap included, as runc update --memory N --memory-swap N does:
// the v1 memory controller's limits (memory+swap never below memory, so
// the one that grows is written first), else cgroup2's memory.max with no
// swap.
func setCgroupMemory(id string, bytes uint64) error {
	n := []byte(strconv.FormatUint(bytes, 10))
	v1 := filepath.Join(cgroupRoot, "memory", cgroupPath(id))
	if _, err := os.Stat(v1); err != nil {
		v2 := filepath.Join(cgroupRoot, cgroupPath(id))
		if err := os.WriteFile(filepath.Join(v2, "memory.max"), n, 0); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(v2, "memory.swap.max"), []byte("0"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	files := []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
	if cur, err := readValue(filepath.Join(v1, files[0])); err == nil && bytes > cur {
		files[0], files[1] = files[1], files[0]
	}
	for _, f := range files {
		// Without swap accounting there is no memsw file.
		if err := os.WriteFile(filepath.Join(v1, f), n, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// readKey reads "key value" from a flat keyed cgroup file.
func readKey(path, key string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return keyValue(b, key)
}

// keyValue finds "key value" among the lines of a flat keyed cgroup file.
func keyValue(data []byte, key string) (uint64, bool) {
	for line := range strings.Lines(string(data)) {
		k, v, _ := strings.Cut(line, " ")
		if k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// cgroupDirs returns the execution's cgroup directories that exist, in
// every hierarchy (v1 controllers, named hierarchies, the v2 tree).
func cgroupDirs(id string) []string {
	cg := cgroupPath(id)
	var dirs []string
	if fi, err := os.Stat(filepath.Join(cgroupRoot, cg)); err == nil && fi.IsDir() {
		dirs = append(dirs, filepath.Join(cgroupRoot, cg))
	}
	ents, _ := os.ReadDir(cgroupRoot)
	for _, e := range ents {
		p := filepath.Join(cgroupRoot, e.Name(), cg)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			dirs = append(dirs, p)
		}
	}
	return dirs
}

// removeCgroups removes the execution's cgroup directories that the
// runtime left, children first. A cgroup still holding tasks (a process
// that outlived the runtime's kill) is retried briefly.
func removeCgroups(id string) error {
	var errs []error
	for _, dir := range cgroupDirs(id) {
		if err := removeCgroupTree(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeCgroupTree(dir string) error {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	var err error
	for i := 0; i < 20; i++ {
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &os.PathError{Op: "rmdir", Path: dir, Err: err}
}

// cgroupFile is a small cgroup file kept open and read from its start at
// each read (the kernel makes its content anew for each read at offset 0).
type cgroupFile struct {
	f *os.File
}

// cgroupFileMax bounds what a cgroupFile reads: the files it keeps are a
// few short lines.
const cgroupFileMax = 4 << 10

// cgroupFileBuffers are the buffers of cgroupFile reads, shared, so that
// an execution keeps no buffer between its checks.
var cgroupFileBuffers = sync.Pool{New: func() any { return new([cgroupFileMax]byte) }}

// read hands parse the content of the kept file, or, when none is kept or
// its read fails (a cgroup removed reads ENODEV) or parse refuses it, of
// the first of paths that parse accepts, which it then keeps. The content
// is valid only during the call.
func (c *cgroupFile) read(paths []string, parse func([]byte) bool) {
	buf := cgroupFileBuffers.Get().(*[cgroupFileMax]byte)
	defer cgroupFileBuffers.Put(buf)
	if c.f != nil {
		if c.readInto(buf, parse) {
			return
		}
		c.close()
	}
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		c.f = f
		if c.readInto(buf, parse) {
			return
		}
		c.close()
	}
}

// readInto reads the kept file from its start into buf and reports
// whether the read succeeded and parse accepted the content.
func (c *cgroupFile) readInto(buf *[cgroupFileMax]byte, parse func([]byte) bool) bool {
	n, err := c.f.ReadAt(buf[:], 0)
	return (err == nil || errors.Is(err, io.EOF)) && parse(buf[:n])
}

// readPressure reads a memory.pressure file, the first of paths that
// parses; nil when none does (a kernel without PSI).
func (c *cgroupFile) readPressure(paths []string) *psi.Pressure {
	var p *psi.Pressure
	c.read(paths, func(b []byte) bool {
		pr, err := psi.Parse(b)
		if err == nil {
			p = &pr
		}
		return err == nil
	})
	return p
}

func (c *cgroupFile) close() {
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
}

// limitHostTasks bounds the tasks of all executions together, pids.max of
// executionsPidsCgroup, to hostTaskLimit: each execution's own limit is
// fixed, so without this enough guests that fork without end would take
// every task ID of the host, and the host's own programs (this process,
// runc, sshd) could start none. A number already there (the operator's,
// or an earlier start's) is kept.
func limitHostTasks() error {
	limit, err := hostTaskLimit()
	if err != nil {
		return err
	}
	dir, v1 := executionsPidsCgroup()
	if !v1 {
		// The controller's files appear in dir only when the root hands
		// it down, as runc would at the first start.
		if err := os.WriteFile(filepath.Join(cgroupRoot, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
			return fmt.Errorf("enable the pids controller: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	file := filepath.Join(dir, "pids.max")
	b, err := os.ReadFile(file)
	if err != nil || strings.TrimSpace(string(b)) != "max" {
		return err
	}
	return os.WriteFile(file, []byte(strconv.FormatUint(limit, 10)), 0)
}

// executionsPidsCgroup returns executionsCgroup on the pids controller:
// on cgroup v1's pids hierarchy where it is mounted (v1 is true), else on
// the cgroup2 tree.
func executionsPidsCgroup() (dir string, v1 bool) {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "pids", "tasks")); err == nil {
		return filepath.Join(cgroupRoot, "pids", executionsCgroup), true
	}
	return filepath.Join(cgroupRoot, executionsCgroup), false
}

// hostTaskLimit is the host's task IDs (the lesser of kernel.pid_max and
// kernel.threads-max) less a reserve for its own programs: an eighth of
// them, and at least minHostTaskReserve.
func hostTaskLimit() (uint64, error) {
	pidMax, err := readValue("/proc/sys/kernel/pid_max")
	if err != nil {
		return 0, err
	}
	threadsMax, err := readValue("/proc/sys/kernel/threads-max")
	if err != nil {
		return 0, err
	}
	return tasksLeftToExecutions(min(pidMax, threadsMax)), nil
}

// minHostTaskReserve is the least number of task IDs kept from the
// executions for the host's own programs.
const minHostTaskReserve = 1024

// tasksLeftToExecutions is what of total task IDs the executions may hold
// together: the reserve is never more than half.
func tasksLeftToExecutions(total uint64) uint64 {
	return total - max(total/8, min(minHostTaskReserve, total/2))
}
