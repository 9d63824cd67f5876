package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/psi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// memoryPressure reads the memory.pressure of the execution's cgroup in
// the cgroup2 tree: /sys/fs/cgroup/unified/... where cgroup2 is mounted
// beside the v1 controllers (runc creates the execution's cgroup there
// too), /sys/fs/cgroup/... on a cgroup2-only host. nil when neither
// exists or parses (a kernel without PSI).
func memoryPressure(id string) *psi.Pressure {
	var f cgroupFile
	defer f.close()
	return f.readPressure(pressureFiles(id))
}

// pressureFiles are the files that may hold the execution's memory
// pressure, in the order memoryPressure tries them.
func pressureFiles(id string) []string {
	cg := cgroupPath(id)
	return []string{
		filepath.Join(cgroupRoot, "unified", cg, "memory.pressure"),
		filepath.Join(cgroupRoot, cg, "memory.pressure"),
	}
}

// memoryCgroupDir is the execution's cgroup that its memory limit is on:
// the v1 memory controller's, else the cgroup2 one.
func memoryCgroupDir(id string) string {
	v1 := filepath.Join(cgroupRoot, "memory", cgroupPath(id))
	if _, err := os.Stat(v1); err == nil {
		return v1
	}
	return filepath.Join(cgroupRoot, cgroupPath(id))
}

// killAttempts bounds how often KillLargestProcess chooses again when the
// chosen process ended or its PID was reused before it was pinned.
const killAttempts = 3

// KillLargestProcess kills the largest process of the guest and returns
// once it has ended; see runtime.Driver. The guest's processes are those
// of the execution's memory cgroup in the PID namespace of its init (the
// guest agent) that still hold memory (not zombies). The chosen process
// is pinned with a pidfd and read again before the signal, so that a PID
// reused in between is never killed. Under runsc the cgroup holds the
// sandbox, not the guest's processes (those live in gVisor's kernel):
// errors.ErrUnsupported, rather than kill the sandbox whole.
func (d *Driver) KillLargestProcess(ctx context.Context, id string) (runtime.GuestProcess, error) {
	if err := checkID(id); err != nil {
		return runtime.GuestProcess{}, err
	}
	if _, err := os.Stat(d.dir(id)); errors.Is(err, os.ErrNotExist) {
		return runtime.GuestProcess{}, runtime.ErrNotFound
	}
	if d.name == Runsc {
		return runtime.GuestProcess{}, fmt.Errorf("oci: runsc's guest processes are not host processes: %w", errors.ErrUnsupported)
	}
	st, err := d.state(ctx, id)
	if err != nil {
		return runtime.GuestProcess{}, err
	}
	if !st.alive() || st.Pid <= 0 {
		return runtime.GuestProcess{}, fmt.Errorf("oci: execution %s does not run", id)
	}
	guestNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", st.Pid))
	if err != nil {
		return runtime.GuestProcess{}, fmt.Errorf("oci: the init of %s: %w", id, err)
	}
	for range killAttempts {
		procs, hostPIDs, err := guestProcesses(memoryCgroupDir(id), guestNS)
		if err != nil {
			return runtime.GuestProcess{}, err
		}
		p, ok := runtime.LargestProcess(procs)
		if !ok {
			return runtime.GuestProcess{}, runtime.ErrNoProcess
		}
		if killed, err := killPinned(ctx, hostPIDs[p.PID], p, guestNS); err != nil || killed {
			return p, err
		}
	}
	return runtime.GuestProcess{}, fmt.Errorf("oci: the processes of %s kept changing", id)
}

// killPinned sends SIGKILL to host PID pid if it still is p and waits
// until it has ended; killed is false when it is not p (it ended, or its
// PID was reused).
func killPinned(ctx context.Context, pid int, p runtime.GuestProcess, guestNS string) (killed bool, err error) {
	pidfd, err := openPidfd(pid)
	if err != nil {
		return false, nil
	}
	defer pidfd.Close()
	now, ok := readGuestProcess(pid, guestNS)
	if !ok || now.PID != p.PID || now.Command != p.Command {
		return false, nil
	}
	if err := signalPidfd(pidfd, unix.SIGKILL); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("oci: kill %s (pid %d in the guest): %w", p.Command, p.PID, err)
	}
	if err := waitPidfd(ctx, pidfd); err != nil {
		return true, fmt.Errorf("oci: waiting for %s (pid %d in the guest) to end: %w", p.Command, p.PID, err)
	}
	return true, nil
}

// guestProcesses lists the processes of the cgroup dir that run in the
// PID namespace guestNS, and maps their guest PIDs to host PIDs.
// Processes that end while it reads are left out.
func guestProcesses(dir, guestNS string) ([]runtime.GuestProcess, map[int32]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, nil, err
	}
	var procs []runtime.GuestProcess
	hostPIDs := map[int32]int{}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, nil, fmt.Errorf("oci: %s/cgroup.procs: %q", dir, f)
		}
		if p, ok := readGuestProcess(pid, guestNS); ok {
			procs = append(procs, p)
			hostPIDs[p.PID] = pid
		}
	}
	return procs, hostPIDs, nil
}

// readGuestProcess reads host PID pid as a process of the guest whose
// PID namespace is guestNS; ok is false when it has ended (a zombie
// included) or runs in another namespace.
func readGuestProcess(pid int, guestNS string) (p runtime.GuestProcess, ok bool) {
	proc := fmt.Sprintf("/proc/%d", pid)
	if ns, err := os.Readlink(proc + "/ns/pid"); err != nil || ns != guestNS {
		return p, false
	}
	status, err := os.ReadFile(proc + "/status")
	if err != nil {
		return p, false
	}
	comm, err := os.ReadFile(proc + "/comm")
	if err != nil {
		return p, false
	}
	p, live, err := parseProcStatus(status)
	if err != nil || !live {
		return p, false
	}
	p.Command = string(bytes.TrimSuffix(comm, []byte("\n")))
	return p, true
}

// parseProcStatus reads the PID in the innermost namespace (the last of
// NSpid) and the resident set (VmRSS) of a /proc/PID/status; live is
// false for a process that no longer has memory (a zombie, or one that
// is exiting), which has no VmRSS.
func parseProcStatus(status []byte) (p runtime.GuestProcess, live bool, err error) {
	var nspid bool
	for _, line := range strings.Split(string(status), "\n") {
		key, val, _ := strings.Cut(line, ":")
		fields := strings.Fields(val)
		switch {
		case key == "NSpid" && len(fields) > 0:
			n, err := strconv.ParseInt(fields[len(fields)-1], 10, 32)
			if err != nil {
				return p, false, fmt.Errorf("NSpid %q: %w", val, err)
			}
			p.PID, nspid = int32(n), true
		case key == "VmRSS" && len(fields) == 2 && fields[1] == "kB":
			kb, err := strconv.ParseUint(fields[0], 10, 64)
			if err != nil {
				return p, false, fmt.Errorf("VmRSS %q: %w", val, err)
			}
			p.RSSBytes, live = kb<<10, true
		}
	}
	if !nspid {
		return p, false, errors.New("no NSpid")
	}
	return p, live, nil
}
