package daemon_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk"
)

// TestLaunchKeptUntilExplicitStart: the host restarts with a new
// kibotos-guest build, which registers a new launch revision. The running
// workspace is adopted and keeps its launch; a stop and an explicit start
// rebind it to the new one, and launch_binding_version is 2. Rolled back
// to the first build, the host runs new workspaces again, on the first
// launch.
func TestLaunchKeptUntilExplicitStart(t *testing.T) {
	home := t.TempDir()
	d := up(t, home)
	ws := d.create(small())
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	first := ws.Spec.LaunchRef
	if first == "" || ws.Spec.LaunchBindingVersion != 1 {
		t.Fatalf("created bound to %q version %d", first, ws.Spec.LaunchBindingVersion)
	}

	// Another build of the guest agent: the same program, other bytes.
	guest, err := os.ReadFile(guestAgent)
	if err != nil {
		t.Fatal(err)
	}
	rebuilt := filepath.Join(t.TempDir(), "kibotos-guest")
	if err := os.WriteFile(rebuilt, append(guest, "\nrebuilt\n"...), 0o755); err != nil {
		t.Fatal(err)
	}
	d.cancel() // the host restarts; its execution runs on
	if err := <-d.done; err != nil {
		t.Fatal(err)
	}
	d = upWith(t, home, daemon.Options{GuestAgent: rebuilt})
	defer func() { d.stop() }()
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if ws.Spec.LaunchRef != first || ws.Spec.LaunchBindingVersion != 1 || ws.Generation != 1 {
		t.Fatalf("after the host's restart: bound to %q version %d, generation %d; want %q version 1, generation 1",
			ws.Spec.LaunchRef, ws.Spec.LaunchBindingVersion, ws.Generation, first)
	}

	mustUnary(t, d.client.StopWorkspace, &ctrlv1.StopWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	started := mustUnary(t, d.client.StartWorkspace, &ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}).Workspace
	if started.Spec.LaunchRef == first || started.Spec.LaunchBindingVersion != 2 {
		t.Errorf("started bound to %q version %d; want a new launch, version 2", started.Spec.LaunchRef, started.Spec.LaunchBindingVersion)
	}
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if ws.Spec.LaunchRef != started.Spec.LaunchRef || ws.Spec.LaunchBindingVersion != 2 || ws.Generation != 2 {
		t.Errorf("running again: bound to %q version %d, generation %d", ws.Spec.LaunchRef, ws.Spec.LaunchBindingVersion, ws.Generation)
	}

	d.cancel()
	if err := <-d.done; err != nil {
		t.Fatal(err)
	}
	d = up(t, home)
	rolledBack := d.await(d.create(small()).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if rolledBack.Spec.LaunchRef != first {
		t.Errorf("created after the rollback bound to %q, want the first launch %q", rolledBack.Spec.LaunchRef, first)
	}
}

// TestCapabilityGvisor: on a host without a working runsc no host offers
// runtime.gvisor, and a workspace requiring it is refused as
// CAPABILITY_UNAVAILABLE; with runsc, a host that runs it offers it and
// the workspace runs there.
func TestCapabilityGvisor(t *testing.T) {
	require := func() *ctrlv1.WorkspaceCreateSpec {
		spec := small()
		spec.Capabilities = &ctrlv1.CapabilityRequirements{Required: []string{"runtime.gvisor"}}
		return spec
	}
	t.Run("unavailable", func(t *testing.T) {
		d := up(t, t.TempDir())
		defer d.stop()
		_, err := d.client.CreateWorkspace(context.Background(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: require()}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || testutil.ErrorDetail(err).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE {
			t.Fatalf("requiring runtime.gvisor on runc: %v, want failed_precondition CAPABILITY_UNAVAILABLE", err)
		}
	})
	t.Run("runsc", func(t *testing.T) {
		if _, err := exec.LookPath(oci.Runsc); err != nil {
			t.Skip("runsc is not installed on this machine, so no host here offers runtime.gvisor")
		}
		d := upWith(t, t.TempDir(), daemon.Options{Runtime: oci.Runsc})
		defer d.stop()
		ws := d.create(require())
		if ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE); ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			t.Fatalf("a workspace requiring runtime.gvisor on runsc: %v", ws)
		}
		// Its processes run on gVisor's kernel, through the data plane.
		sws, err := d.sdkClient().Workspace(context.Background(), ws.WorkspaceId)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if st, err := sws.Exec(context.Background(), []string{"dmesg"}, sdk.ExecOptions{Stdout: &out}); err != nil || !st.Success() ||
			!strings.Contains(out.String(), "Starting gVisor") {
			t.Errorf("dmesg in the workspace: %+v, %v, %q; want gVisor's", st, err, out.String())
		}
	})
}
