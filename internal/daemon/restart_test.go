package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
	"github.com/kibotos/kibotos/sdk"
)

// TestGuestReboot: `reboot` inside the guest resets it and it comes back
// within the same execution: the workspace stays AVAILABLE at the same
// generation, guest_observation counts the reset (restart_count,
// last_reset_at, rebooted), a file written in / is kept, the guest is in
// the same network namespace with its policy still applied, a new PID 1
// runs without the processes of the old one, and the data plane works.
// The host holds as many mounts for it as before, and nothing of it once
// it is deleted.
func TestGuestReboot(t *testing.T) {
	e := newNetEnv(t)
	ctx := context.Background()
	v4 := net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))
	e.setPolicy(public(nil))
	if !e.talk(v4) {
		t.Fatal("the guest does not reach the test host before the reboot")
	}
	ws := e.awaitWorkspace("RESPONDING", func(ws *ctrlv1.Workspace) bool {
		return condition(ws) == ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING
	})
	if g := ws.GuestObservation; g.RestartCount != 0 || g.LastResetAt != nil || g.Rebooted {
		t.Errorf("before the reboot: %v", g)
	}
	init := guestInit(t, ws)
	netns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", init))
	if err != nil {
		t.Fatal(err)
	}
	handle, err := e.sdkClient().Workspace(ctx, ws.WorkspaceId)
	if err != nil {
		t.Fatal(err)
	}
	// The sleepers' pids lie well past those the guest agent's threads
	// take as it boots (each takes a pid too, as many as the load makes it
	// start), so that a process of the next boot can take one. Several,
	// since the agent's threads may take some of them first.
	if _, err := e.exec(ws, "sh", "-c", forkPast(1000)); err != nil {
		t.Fatal(err)
	}
	sleepers := map[int]*sdk.Process{}
	for range 16 {
		p, err := handle.Start(ctx, []string{"sleep", "1000"}, sdk.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sleepers[p.Pid()] = p
	}
	lowest := slices.Min(slices.Collect(maps.Keys(sleepers)))
	if _, err := e.exec(ws, "sh", "-c", "echo kept > /kept"); err != nil {
		t.Fatal(err)
	}
	mounts := mountsOf(t, ws.WorkspaceId)

	rebootAt := time.Now()
	e.exec(ws, "reboot") // its process ends with the guest's
	ws = e.awaitWorkspace("restart_count 1", func(ws *ctrlv1.Workspace) bool {
		return ws.GuestObservation.GetRestartCount() == 1 && condition(ws) == ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING
	})
	t.Logf("from reboot to the guest observed back: %v", time.Since(rebootAt).Round(time.Millisecond))
	if g := ws.GuestObservation; ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || ws.Generation != e.ws.Generation ||
		!g.Rebooted || g.LastResetAt == nil || ws.LastStop != nil || ws.NetworkPolicyStatus.GetAppliedRevision() != 2 {
		t.Errorf("after the reboot: state %v, generation %d (was %d), last_stop %v, policy %v, guest %v",
			ws.State, ws.Generation, e.ws.Generation, ws.LastStop, ws.NetworkPolicyStatus, g)
	}
	again := guestInit(t, ws)
	if again == init {
		t.Errorf("PID 1 is still host process %d", init)
	}
	if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", again)); err != nil || ns != netns {
		t.Errorf("the guest came back in network namespace %s (%v), was %s", ns, err, netns)
	}
	for _, sleeper := range sleepers {
		if st, err := sleeper.Wait(); err == nil && st.Success() {
			t.Errorf("a process of the guest before the reboot ended well: %v", st)
		}
	}
	// A handle of the guest before the reboot never reaches a process of
	// this one that took its pid.
	if _, err := e.exec(ws, "sh", "-c", forkPast(lowest-10)); err != nil {
		t.Fatal(err)
	}
	var taker, sleeper *sdk.Process
	for range 500 {
		p, err := handle.Start(ctx, []string{"sleep", "1000"}, sdk.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sleeper = sleepers[p.Pid()]; sleeper != nil {
			taker = p
			break
		}
		p.Kill(ctx)
		p.Wait()
	}
	if taker == nil {
		t.Fatalf("no process of the rebooted guest took a pid of %v", slices.Sorted(maps.Keys(sleepers)))
	}
	if err := sleeper.Kill(ctx); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("killing the process of before the reboot: %v, want not_found", err)
	}
	taker.Kill(ctx)
	if st, _ := taker.Wait(); st.Signal != "SIGKILL" {
		t.Errorf("the process that took the pid ended %v, want SIGKILL by its own handle", st)
	}

	var out bytes.Buffer
	if st, err := handle.Exec(ctx, []string{"cat", "/kept"}, sdk.ExecOptions{Stdout: &out}); err != nil || !st.Success() || out.String() != "kept\n" {
		t.Errorf("the file written before the reboot, through the data plane: %q, %v, %v", out.String(), st, err)
	}
	out.Reset()
	if _, err := handle.Exec(ctx, []string{"sh", "-c", "ps -o comm | grep -c sleep || true"}, sdk.ExecOptions{Stdout: &out}); err != nil || strings.TrimSpace(out.String()) != "0" {
		t.Errorf("sleeps left after the reboot: %q, %v", out.String(), err)
	}
	if !e.talk(v4) {
		t.Error("the guest does not reach the test host after the reboot")
	}
	if n := mountsOf(t, ws.WorkspaceId); n != mounts {
		t.Errorf("the host holds %d mounts of the workspace after the reboot, %d before", n, mounts)
	}

	if _, err := e.client.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
		t.Fatal(err)
	}
	e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	testutil.AssertNothingLeft(t, e.home, ws.WorkspaceId)
}

// mountsOf counts the host's mounts whose line names the workspace.
func mountsOf(t *testing.T, workspaceID string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, workspaceID) {
			n++
		}
	}
	return n
}

// TestGuestIgnoresSignalsOfNoMeaning: signals that mean nothing to init
// (HUP, QUIT, ABRT, SEGV sent with kill, ...) do not end the guest agent,
// which as PID 1 would reset the guest uncleanly; the processes it starts
// still get them as usual.
func TestGuestIgnoresSignalsOfNoMeaning(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ws := d.await(d.create(small()).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	init := guestInit(t, ws)
	for _, sig := range []string{"HUP", "QUIT", "ABRT", "TRAP", "SYS", "SEGV", "BUS"} {
		if out, err := d.exec(ws, "sh", "-c", "kill -"+sig+" 1"); err != nil {
			t.Fatalf("kill -%s 1: %v %s", sig, err, out)
		}
	}
	// A guest agent the runtime ended would be gone within this.
	time.Sleep(time.Second)
	if out, err := d.exec(ws, "true"); err != nil {
		t.Fatalf("after the signals: %v %s", err, out)
	}
	if again := guestInit(t, ws); again != init {
		t.Errorf("PID 1 is host process %d, was %d: the signals reset the guest", again, init)
	}
	if out, err := d.exec(ws, "sh", "-c", "sleep 100 & kill -HUP $!; wait $!; echo status $?"); err != nil || !strings.Contains(out, "status 129") {
		t.Errorf("a process of the guest got HUP: %q, %v; want it ended (129)", out, err)
	}
}

// forkPast is a shell script that forks until the guest's last new pid is
// at least pid.
func forkPast(pid int) string {
	return fmt.Sprintf("p=0; while [ $p -lt %d ]; do /bin/true & p=$!; wait $p; done", pid)
}
