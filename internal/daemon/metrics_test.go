package daemon_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
	"github.com/kibotos/kibotos/sdk"
)

// cgroupFigures are the figures of an execution as its cgroup files hold
// them, read by the test on the host.
type cgroupFigures struct {
	cpu                  time.Duration
	memory, memoryLimit  uint64
	someAvg10, fullAvg10 float64
	processes            uint32
}

// readCgroup reads the cgroup files of an execution: the v1 controllers
// (and the cgroup2 tree of a hybrid layout for pressure), or its cgroup2
// directory where that is all the host mounts.
func readCgroup(t *testing.T, execution string) cgroupFigures {
	t.Helper()
	const root = "/sys/fs/cgroup"
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	read := func(parts ...string) string {
		b, err := os.ReadFile(filepath.Join(append([]string{root}, parts...)...))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	number := func(s string) uint64 {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	cg := filepath.Join("kibotos", execution)
	var f cgroupFigures
	var pressure string
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		var usec uint64
		fmt.Sscanf(read(cg, "cpu.stat"), "usage_usec %d", &usec)
		f.cpu = time.Duration(usec) * time.Microsecond
		f.memory, f.memoryLimit = number(read(cg, "memory.current")), number(read(cg, "memory.max"))
		f.processes = uint32(strings.Count(read(cg, "cgroup.procs"), "\n"))
		pressure = read(cg, "memory.pressure")
	} else {
		f.cpu = time.Duration(number(read("cpuacct", cg, "cpuacct.usage")))
		f.memory = number(read("memory", cg, "memory.usage_in_bytes"))
		f.memoryLimit = number(read("memory", cg, "memory.limit_in_bytes"))
		f.processes = uint32(strings.Count(read("memory", cg, "cgroup.procs"), "\n"))
		pressure = read("unified", cg, "memory.pressure")
	}
	// "some avg10=0.12 avg60=... total=...", then the same of "full".
	for _, line := range strings.Split(strings.TrimSpace(pressure), "\n") {
		fields := strings.Fields(line)
		avg10, ok := strings.CutPrefix(fields[1], "avg10=")
		v, err := strconv.ParseFloat(avg10, 64)
		if !ok || err != nil {
			t.Fatalf("memory.pressure %q", pressure)
		}
		if fields[0] == "some" {
			f.someAvg10 = v
		} else {
			f.fullAvg10 = v
		}
	}
	return f
}

// guestView is what the guest itself reports of its filesystems and
// network link.
type guestView struct {
	rootUsed, rootSize, dataUsed, dataSize uint64
	received, sent                         uint64
}

// readGuest asks the guest: df of / (the writable layer under the
// overlay) and of the Volume's mount, and its /proc/net/dev.
func readGuest(t *testing.T, ws *sdk.Workspace) guestView {
	t.Helper()
	var out, errOut bytes.Buffer
	st, err := ws.Exec(t.Context(), []string{"sh", "-c", "df -P -B1 / /data && echo --- && cat /proc/net/dev"}, sdk.ExecOptions{Stdout: &out, Stderr: &errOut})
	if err != nil || !st.Success() {
		t.Fatalf("reading the guest: %v, %v: %s", st, err, errOut.String())
	}
	df, dev, _ := strings.Cut(out.String(), "---\n")
	var g guestView
	lines := strings.Split(strings.TrimSpace(df), "\n")
	if len(lines) != 3 {
		t.Fatalf("df printed %q", df)
	}
	for i, dst := range [][2]*uint64{{&g.rootSize, &g.rootUsed}, {&g.dataSize, &g.dataUsed}} {
		f := strings.Fields(lines[i+1])
		if len(f) < 3 {
			t.Fatalf("df line %q", lines[i+1])
		}
		*dst[0], _ = strconv.ParseUint(f[1], 10, 64)
		*dst[1], _ = strconv.ParseUint(f[2], 10, 64)
	}
	if g.received, g.sent, err = nettest.InterfaceBytes(dev, "eth0"); err != nil {
		t.Fatal(err)
	}
	return g
}

// between reports whether v lies between a and b, in either order.
func between[T int64 | uint64 | uint32 | float64](v, a, b T) bool {
	return min(a, b) <= v && v <= max(a, b)
}

// TestWorkspaceMetrics: ReadMetrics through the gateway of a real
// deployment agrees with the execution's cgroup files read on the host and
// with df and /proc/net/dev inside the guest, each figure between the
// reads taken just before and just after it; a stopped workspace has
// none.
func TestWorkspaceMetrics(t *testing.T) {
	e := newVolumeEnv(t)
	defer e.stop()
	created := e.create(withVolume(&ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW}))
	created = e.await(created.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	execution := fmt.Sprintf("%s-%d", created.WorkspaceId, created.Generation)
	ws, err := e.sdkClient().Workspace(t.Context(), created.WorkspaceId)
	if err != nil {
		t.Fatal(err)
	}
	// Something in each place: files on the layer and the Volume, CPU
	// time, and traffic on the link (a DNS query the slot answers REFUSED
	// under DENY_ALL).
	var out bytes.Buffer
	if st, err := ws.Exec(t.Context(), []string{"sh", "-c", "dd if=/dev/zero of=/filler bs=1M count=6 2>/dev/null && " +
		"dd if=/dev/zero of=/data/filler bs=1M count=4 2>/dev/null && sync && " +
		"i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; " +
		"nslookup internet.test || true"}, sdk.ExecOptions{Stdout: &out, Stderr: &out}); err != nil || !st.Success() {
		t.Fatalf("filling the workspace: %v, %v: %s", st, err, out.String())
	}

	guestBefore := readGuest(t, ws)
	hostBefore := readCgroup(t, execution)
	m, err := ws.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	hostAfter := readCgroup(t, execution)
	guestAfter := readGuest(t, ws)
	t.Logf("metrics %v", m)

	cpu := time.Duration(m.CpuUsageSeconds * float64(time.Second))
	if !between(int64(cpu), int64(hostBefore.cpu-time.Microsecond), int64(hostAfter.cpu+time.Microsecond)) || cpu < 10*time.Millisecond {
		t.Errorf("CPU %s; the cgroup counted %s before, %s after", cpu, hostBefore.cpu, hostAfter.cpu)
	}
	// Memory moves with whatever the guest agent does meanwhile: within a
	// MiB of the reads around it.
	low, high := min(hostBefore.memory, hostAfter.memory), max(hostBefore.memory, hostAfter.memory)
	if !between(m.MemoryBytes, low-min(low, mib), high+mib) || m.MemoryBytes == 0 {
		t.Errorf("memory %d; the cgroup counted %d before, %d after", m.MemoryBytes, hostBefore.memory, hostAfter.memory)
	}
	if m.MemoryLimitBytes != 128*mib || hostBefore.memoryLimit != 128*mib {
		t.Errorf("memory limit %d, the cgroup's %d; want %d", m.MemoryLimitBytes, hostBefore.memoryLimit, 128*mib)
	}
	if !between(m.MemorySomeAvg10, hostBefore.someAvg10, hostAfter.someAvg10) || !between(m.MemoryFullAvg10, hostBefore.fullAvg10, hostAfter.fullAvg10) {
		t.Errorf("pressure %v/%v; the cgroup had %v/%v before, %v/%v after", m.MemorySomeAvg10, m.MemoryFullAvg10,
			hostBefore.someAvg10, hostBefore.fullAvg10, hostAfter.someAvg10, hostAfter.fullAvg10)
	}
	if !between(m.Processes, hostBefore.processes, hostAfter.processes) || m.Processes < 1 {
		t.Errorf("%d processes; the cgroup had %d before, %d after", m.Processes, hostBefore.processes, hostAfter.processes)
	}
	if !between(m.WritableLayerUsedBytes, guestBefore.rootUsed, guestAfter.rootUsed) || m.WritableLayerCapacityBytes != guestBefore.rootSize ||
		m.WritableLayerUsedBytes < 6*mib || m.WritableLayerCapacityBytes > 64*mib {
		t.Errorf("layer %d of %d; df / in the guest: %d of %d before, %d after", m.WritableLayerUsedBytes, m.WritableLayerCapacityBytes,
			guestBefore.rootUsed, guestBefore.rootSize, guestAfter.rootUsed)
	}
	if !between(m.VolumeUsedBytes, guestBefore.dataUsed, guestAfter.dataUsed) || m.VolumeCapacityBytes != guestBefore.dataSize ||
		m.VolumeUsedBytes < 4*mib || m.VolumeCapacityBytes > 64*mib {
		t.Errorf("volume %d of %d; df /data in the guest: %d of %d before, %d after", m.VolumeUsedBytes, m.VolumeCapacityBytes,
			guestBefore.dataUsed, guestBefore.dataSize, guestAfter.dataUsed)
	}
	if !between(m.NetworkRxBytes, guestBefore.received, guestAfter.received) || !between(m.NetworkTxBytes, guestBefore.sent, guestAfter.sent) ||
		m.NetworkRxBytes == 0 || m.NetworkTxBytes == 0 {
		t.Errorf("network %d received, %d sent; the guest's eth0: %d, %d before, %d, %d after", m.NetworkRxBytes, m.NetworkTxBytes,
			guestBefore.received, guestBefore.sent, guestAfter.received, guestAfter.sent)
	}

	e.stopWorkspace(created.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	e.await(created.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	// No execution serves the handle's session, and a new one is issued
	// only for an AVAILABLE workspace: the refusal says so, once the host
	// has the stopped execution's end (until then it answers "retry once
	// it runs").
	_, err = ws.Metrics(t.Context())
	for deadline := time.Now().Add(10 * time.Second); connect.CodeOf(err) == connect.CodeUnavailable && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		_, err = ws.Metrics(t.Context())
	}
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "STOPPED") {
		t.Errorf("metrics of a stopped workspace: %v, want failed_precondition naming its state", err)
	}
}
