package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/diskimage"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// Metrics reads what a running execution uses: its cgroup's counters and
// the statfs of the host's mounts of its writable layer and volume; see
// runtime.Driver. Like CheckGuest it runs no runtime command.
func (d *Driver) Metrics(ctx context.Context, id string) (runtime.Metrics, error) {
	if err := checkID(id); err != nil {
		return runtime.Metrics{}, err
	}
	if err := ctx.Err(); err != nil {
		return runtime.Metrics{}, err
	}
	rec, err := d.readRecord(id)
	if errors.Is(err, os.ErrNotExist) {
		return runtime.Metrics{}, runtime.ErrNotFound
	}
	if err != nil {
		return runtime.Metrics{}, err
	}
	m, err := readCgroupMetrics(id)
	if err != nil {
		return runtime.Metrics{}, d.public(err, id, map[string]string{cgroupRoot: "<cgroups>"})
	}
	var mounted bool
	m.LayerUsedBytes, m.LayerCapacityBytes, mounted, err = mountedUsage(rec.LayerMount)
	if err == nil && !mounted {
		err = fmt.Errorf("oci: the writable layer of %s is not mounted", id)
	}
	if err == nil && rec.VolumeImage != "" {
		m.VolumeUsedBytes, m.VolumeCapacityBytes, mounted, err = mountedUsage(rec.VolumeMount)
		if err == nil && !mounted {
			err = fmt.Errorf("oci: the volume of %s is not mounted", id)
		}
	}
	if err != nil {
		return runtime.Metrics{}, d.public(err, id, nil)
	}
	return m, nil
}

// mountedUsage is diskimage.Usage of the filesystem mounted at dir, and
// whether one was: mounted before and after the statfs, so that the
// numbers are the filesystem's, not those of the directory under it.
func mountedUsage(dir string) (used, capacity uint64, mounted bool, err error) {
	if !isMountPoint(dir) {
		return 0, 0, false, nil
	}
	used, capacity, err = diskimage.Usage(dir)
	if err != nil || !isMountPoint(dir) {
		return 0, 0, false, err
	}
	return used, capacity, true, nil
}

// readCgroupMetrics reads the cgroup figures of execution id: from the
// cgroup v1 controllers where the host mounts them (the memory, cpuacct
// and pids hierarchies, and for pressure the cgroup2 tree of a hybrid
// layout, when there is one), else from its directory in the cgroup2 tree.
func readCgroupMetrics(id string) (runtime.Metrics, error) {
	cg := cgroupPath(id)
	var m runtime.Metrics
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return m, &os.PathError{Op: "statfs", Path: cgroupRoot, Err: err}
	}
	unified := st.Type == unix.CGROUP2_SUPER_MAGIC
	dir := filepath.Join(cgroupRoot, "memory", cg)
	if unified {
		dir = filepath.Join(cgroupRoot, cg)
	}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return m, fmt.Errorf("%w: execution %s does not run", runtime.ErrNotFound, id)
	}
	if err != nil {
		return m, err
	}
	m.Processes = uint32(bytes.Count(procs, []byte("\n")))
	if m.Processes == 0 {
		return m, fmt.Errorf("%w: execution %s does not run", runtime.ErrNotFound, id)
	}
	if unified {
		var usec uint64
		if usec, err = readKeyed(filepath.Join(dir, "cpu.stat"), "usage_usec"); err == nil {
			m.CPU = time.Duration(usec) * time.Microsecond
			m.MemoryBytes, err = readValue(filepath.Join(dir, "memory.current"))
		}
		if err == nil {
			m.MemoryLimitBytes, err = readValue(filepath.Join(dir, "memory.max"))
		}
	} else {
		var nsec uint64
		if nsec, err = readValue(filepath.Join(cgroupRoot, "cpuacct", cg, "cpuacct.usage")); err == nil {
			m.CPU = time.Duration(nsec)
			m.MemoryBytes, err = readValue(filepath.Join(dir, "memory.usage_in_bytes"))
		}
		if err == nil {
			m.MemoryLimitBytes, err = readValue(filepath.Join(dir, "memory.limit_in_bytes"))
		}
	}
	// A kernel that keeps no pressure per cgroup has none: zero.
	if p := memoryPressure(id); p != nil {
		m.MemorySomeAvg10, m.MemoryFullAvg10 = p.Some.Avg10, p.Full.Avg10
	}
	return m, err
}

// readValue reads a cgroup file that holds one number; "max" (no limit)
// is the largest one.
func readValue(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxUint64, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", path, s)
	}
	return n, nil
}

// readKeyed reads "key value" from a flat keyed cgroup file; a missing key
// is an error.
func readKeyed(path, key string) (uint64, error) {
	n, found := readKey(path, key)
	if !found {
		if _, err := os.Stat(path); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%s: no %s", path, key)
	}
	return n, nil
}
