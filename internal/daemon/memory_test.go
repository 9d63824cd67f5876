package daemon_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/host/psi"
)

// memoryCondition is the workspace's guest memory condition.
func memoryCondition(ws *ctrlv1.Workspace) ctrlv1.GuestMemoryCondition {
	return ws.GuestObservation.GetMemoryCondition()
}

// memoryCgroup is a file of the v1 memory cgroup of the workspace's
// current execution, for the failure messages.
func memoryCgroup(ws *ctrlv1.Workspace, file string) string {
	b, _ := os.ReadFile(fmt.Sprintf("/sys/fs/cgroup/memory/kibotos/%s-%d/%s", ws.WorkspaceId, ws.Generation, file))
	return strings.TrimSpace(string(b))
}

// hogChunks of 10 MB are the anonymous memory the loaded workspace
// holds, of its 128 MiB limit; rereadBytes is the file it keeps reading,
// a little more than the limit leaves for the page cache (about 21 MB),
// so that every read evicts what the next needs.
const (
	hogChunks   = 11
	hogBytes    = hogChunks * 10_000_000
	rereadBytes = 25 << 20
)

// saturationThresholds are the test's: on this host's loop-mounted layer
// (its image in the host's page cache) such a workload keeps every
// process stalled on memory for about 6 to 23% of the time, measured in
// 2 s steps, far from the default of half.
var saturationThresholds = psi.Thresholds{Window: 4 * time.Second, SaturatedPermille: 50, KillAfter: 6 * time.Second}

// TestGuestMemorySaturation: a workspace held at its memory limit, a
// shell holding anonymous memory near the limit while another process
// keeps re-reading a file the rest of the limit cannot cache, is
// SATURATED; once that lasts the host kills the shell, the largest
// process, and reports every field of the kill; with the memory freed it
// is NORMAL again, the guest agent untouched. A workspace under no
// pressure reads NORMAL throughout.
func TestGuestMemorySaturation(t *testing.T) {
	th := saturationThresholds
	d := upWith(t, t.TempDir(), daemon.Options{GuestProbeInterval: 500 * time.Millisecond, GuestMemory: th})
	defer d.stop()
	calm := d.create(small())
	loaded := d.create(small())
	calm = d.await(calm.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	loaded = d.await(loaded.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	for _, ws := range []*ctrlv1.Workspace{calm, loaded} {
		d.awaitWorkspace(ws.WorkspaceId, "NORMAL", func(ws *ctrlv1.Workspace) bool {
			return memoryCondition(ws) == ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_NORMAL
		})
	}
	init := guestInit(t, loaded)

	if out, err := d.exec(loaded, "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom >/reread", rereadBytes)); err != nil {
		t.Fatalf("writing the file: %v: %s", err, out)
	}
	// The hog fills shell variables, 10 MB each, then blocks opening a
	// fifo nobody writes; the reader reads the file forever.
	hog := fmt.Sprintf(`for i in $(seq %d); do eval "x$i=\$(head -c 10000000 /dev/zero | tr '\0' x)"; done; touch /tmp/hog.held; read y </tmp/hog`, hogChunks)
	launch := `mkfifo /tmp/hog || exit 1
sh -c "$1" </dev/null >/dev/null 2>&1 & hog=$!
while [ ! -e /tmp/hog.held ]; do kill -0 $hog || exit 1; sleep 0.1; done; echo $hog`
	out, err := d.exec(loaded, "sh", "-c", launch, "sh", hog)
	if err != nil {
		t.Fatalf("starting the hog: %v: %s (memory.stat: %s)", err, out, memoryCgroup(loaded, "memory.stat"))
	}
	hogPID, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("the hog's PID: %q", out)
	}
	if out, err := d.exec(loaded, "sh", "-c", "while :; do cat /reread >/dev/null; done </dev/null >/dev/null 2>&1 &"); err != nil {
		t.Fatalf("starting the reader: %v: %s", err, out)
	}

	ws := d.awaitWorkspace(loaded.WorkspaceId, "SATURATED", func(ws *ctrlv1.Workspace) bool {
		return memoryCondition(ws) == ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_SATURATED
	})
	since := ws.GuestObservation.MemorySaturatedSince
	if g := ws.GuestObservation; since == nil || g.Condition != ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING {
		t.Errorf("SATURATED: %v", g)
	}

	ws = d.awaitWorkspace(loaded.WorkspaceId, "a memory kill", func(ws *ctrlv1.Workspace) bool {
		return ws.GuestObservation.GetMemoryKillCount() > 0
	})
	k := ws.GuestObservation.LatestMemoryKill
	t.Logf("the kill: %v", k)
	if ws.GuestObservation.MemoryKillCount != 1 || k.GetPid() != int32(hogPID) || k.Command != "sh" || k.RssBytes < hogBytes ||
		k.FullStallPermille < th.SaturatedPermille || k.FullStallPermille > 1000 || k.Window.AsDuration() < th.Window ||
		k.SaturatedFor.AsDuration() < th.KillAfter || k.KilledAt.AsTime().Before(since.AsTime().Add(th.KillAfter)) {
		t.Errorf("the kill of the hog (PID %d in the guest; saturated since %v): %v", hogPID, since.AsTime(), ws.GuestObservation)
	}
	if out, err := d.exec(loaded, "kill", "-0", strconv.Itoa(hogPID)); err == nil {
		t.Errorf("the hog (PID %d) still runs: %s", hogPID, out)
	}
	ws = d.awaitWorkspace(loaded.WorkspaceId, "NORMAL after the kill", func(ws *ctrlv1.Workspace) bool {
		return memoryCondition(ws) == ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_NORMAL
	})
	if g := ws.GuestObservation; ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || g.MemorySaturatedSince != nil ||
		g.MemoryKillCount != 1 || g.Condition != ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING || g.Rebooted {
		t.Errorf("after the kill: %v %v", ws.State, g)
	}
	if got := guestInit(t, ws); got != init {
		t.Errorf("the guest agent is PID %d on the host after the kill, was %d", got, init)
	}

	ws, err = d.get(calm.WorkspaceId)
	if g := ws.GetGuestObservation(); err != nil || memoryCondition(ws) != ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_NORMAL ||
		g.MemoryKillCount != 0 || g.LatestMemoryKill != nil || g.MemorySaturatedSince != nil {
		t.Errorf("the workspace under no pressure: %v, %v", g, err)
	}
}

// TestMemoryOvercommit: a host started with a memory overcommit of 2
// places and runs a workspace whose memory limit is one and a half times
// the machine's memory, with that limit on its cgroup, and refuses one of
// two and a half times, storing nothing.
func TestMemoryOvercommit(t *testing.T) {
	var info unix.Sysinfo_t
	if err := unix.Sysinfo(&info); err != nil {
		t.Fatal(err)
	}
	total := info.Totalram * uint64(info.Unit)
	roundMiB := func(n uint64) uint64 { return (n + mib - 1) / mib * mib }
	d := upWith(t, t.TempDir(), daemon.Options{Overcommit: daemon.Overcommit{CPU: 4, Memory: 2}})
	defer d.stop()

	big := roundMiB(total * 3 / 2)
	ws := d.create(&ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 100, MemoryBytes: big, WritableLayerBytes: 64 * mib}})
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if limit := memoryCgroup(ws, "memory.limit_in_bytes"); limit != strconv.FormatUint(big, 10) {
		t.Errorf("memory limit %s, want %d", limit, big)
	}
	if out, err := d.exec(ws, "echo", "ready"); err != nil || out != "ready\n" {
		t.Errorf("echo ready: %q, %v", out, err)
	}

	before, err := d.client.ListWorkspaces(t.Context(), connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.client.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(),
		Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 100, MemoryBytes: roundMiB(total * 5 / 2)}}}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a workspace beyond twice the memory: %v, want resource_exhausted", err)
	}
	after, err := d.client.ListWorkspaces(t.Context(), connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Msg.Workspaces) != len(before.Msg.Workspaces) {
		t.Errorf("the refused create left %d workspaces, want %d", len(after.Msg.Workspaces), len(before.Msg.Workspaces))
	}
}
