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
)

// guestInit returns the host PID of the guest's PID 1 in the workspace's
// current execution: the process of the execution's cgroup whose PID in
// its own namespace is 1.
func guestInit(t *testing.T, ws *ctrlv1.Workspace) int {
	t.Helper()
	procs, err := os.ReadFile(fmt.Sprintf("/sys/fs/cgroup/memory/kibotos/%s-%d/cgroup.procs", ws.WorkspaceId, ws.Generation))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(procs)) {
		status, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ns, ok := strings.CutPrefix(line, "NSpid:"); ok && strings.HasSuffix(strings.TrimSpace(ns), "\t1") {
				pid, _ := strconv.Atoi(f)
				return pid
			}
		}
	}
	t.Fatalf("no PID 1 among the processes of %s: %q", ws.WorkspaceId, procs)
	return 0
}

// condition is the workspace's guest condition.
func condition(ws *ctrlv1.Workspace) ctrlv1.GuestCondition {
	return ws.GuestObservation.GetCondition()
}

// TestGuestProbe: a guest whose PID 1 is stopped from the host becomes
// UNRESPONSIVE, with when and why, while the workspace stays AVAILABLE; it
// is RESPONDING again once continued; a FORCE stop ends a guest left
// stopped, and the stopped workspace has no observation.
func TestGuestProbe(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ws := d.create(small())
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	ws = d.awaitWorkspace(ws.WorkspaceId, "RESPONDING", func(ws *ctrlv1.Workspace) bool {
		return condition(ws) == ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING
	})
	if g := ws.GuestObservation; g.ObservedAt == nil || g.UnresponsiveSince != nil || g.Error != "" || g.Rebooted {
		t.Errorf("RESPONDING: %v", g)
	}
	init := guestInit(t, ws)

	stoppedAt := time.Now()
	if err := unix.Kill(init, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ws = d.awaitWorkspace(ws.WorkspaceId, "UNRESPONSIVE", func(ws *ctrlv1.Workspace) bool {
		return condition(ws) == ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE
	})
	if g := ws.GuestObservation; ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || g.Error == "" ||
		g.UnresponsiveSince == nil || g.UnresponsiveSince.AsTime().Before(stoppedAt.Add(-time.Second)) {
		t.Errorf("UNRESPONSIVE: state %v, %v (stopped at %v)", ws.State, g, stoppedAt)
	}

	if err := unix.Kill(init, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	ws = d.awaitWorkspace(ws.WorkspaceId, "RESPONDING again", func(ws *ctrlv1.Workspace) bool {
		return condition(ws) == ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING
	})
	if g := ws.GuestObservation; g.Error != "" || g.UnresponsiveSince != nil || g.Rebooted {
		t.Errorf("RESPONDING again: %v", g)
	}

	if err := unix.Kill(init, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	d.awaitWorkspace(ws.WorkspaceId, "UNRESPONSIVE again", func(ws *ctrlv1.Workspace) bool {
		return condition(ws) == ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE
	})
	d.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_FORCE)
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if ws.GuestObservation != nil {
		t.Errorf("a stopped workspace has a guest observation: %v", ws.GuestObservation)
	}
}

// TestGuestOOMStop: an execution whose PID 1 the kernel's OOM killer
// kills stops with HOST_MEMORY_EXHAUSTED, released as a forced stop, and
// starts again.
func TestGuestOOMStop(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ws := d.create(small())
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	d.awaitWorkspace(ws.WorkspaceId, "RESPONDING", func(ws *ctrlv1.Workspace) bool {
		return condition(ws) == ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING
	})
	// Make PID 1 the OOM killer's first choice, then exhaust the limit.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", guestInit(t, ws)), []byte("1000"), 0); err != nil {
		t.Fatal(err)
	}
	d.exec(ws, "sh", "-c", "head -c 400000000 /dev/zero | tr '\\0' x | sort >/dev/null") // ends with the guest

	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if ls := ws.LastStop; ls.GetCause() != ctrlv1.StopCause_STOP_CAUSE_HOST_MEMORY_EXHAUSTED || ls.GetMode() != ctrlv1.StopMode_STOP_MODE_FORCE {
		t.Errorf("last_stop after PID 1 was OOM-killed: %v", ls)
	}
	if _, err := d.client.StartWorkspace(t.Context(), connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
		t.Fatal(err)
	}
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
}
