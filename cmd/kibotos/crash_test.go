package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/bearer"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestCrashRecovery kills `kibotos up` with SIGKILL while workspaces are
// AVAILABLE, STOPPING and CREATING, starts it again, and checks that every
// workspace converges to a truthful state and nothing is orphaned.
func TestCrashRecovery(t *testing.T) {
	hosttest.RequireRoot(t)
	bin := build(t)
	home := filepath.Join(t.TempDir(), "home")
	ctx := context.Background()
	// Runs after every process is stopped: release whatever a failure left
	// running, so that no container, mount or loop device outlives the test.
	t.Cleanup(func() {
		drv, err := oci.New(oci.Config{StateDir: filepath.Join(home, "runtime")})
		if err != nil {
			return
		}
		out, _ := exec.Command("runc", "--root", filepath.Join(home, "runtime", "runc"), "list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			drv.Stop(ctx, id, runtime.StopForce, 0)
		}
	})

	up := startUp(t, bin, home)
	client := workspaceClient(t, home, up.addr)
	create := func() string {
		resp, err := client.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
			Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
			Spec:    &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20, WritableLayerBytes: 64 << 20}},
		}))
		if err != nil {
			t.Fatalf("CreateWorkspace: %v", err)
		}
		return resp.Msg.Workspace.WorkspaceId
	}
	available := create()
	stopping := create()
	awaitState(t, client, available, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	awaitState(t, client, stopping, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)

	// A guest process that ignores SIGTERM holds a NORMAL stop in STOPPING
	// for the whole grace period.
	drv, err := oci.New(oci.Config{StateDir: filepath.Join(home, "runtime")})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := drv.Exec(ctx, stopping+"-1", "sh", "-c", "(trap '' TERM; exec sleep 600) </dev/null >/dev/null 2>&1 &"); err != nil {
		t.Fatalf("start a stubborn process: %v %s", err, out)
	}
	if _, err := client.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, WorkspaceId: stopping})); err != nil {
		t.Fatal(err)
	}
	resp, err := client.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: stopping}))
	if err != nil || resp.Msg.Workspace.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING {
		t.Fatalf("before the crash, the stopping workspace is %v, %v", resp.Msg.GetWorkspace().GetState(), err)
	}
	// Killed right after the create returns: the host agent is delivering
	// or starting it.
	creating := create()
	up.kill()

	up = startUp(t, bin, home)
	client = workspaceClient(t, home, up.addr)
	ws := awaitState(t, client, available, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if ws.Generation != 1 {
		t.Errorf("the available workspace restarted: generation %d", ws.Generation)
	}
	ws = awaitState(t, client, stopping, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if ws.LastStop.GetCompletedAt() == nil {
		t.Errorf("stop finished without completion: %v", ws.LastStop)
	}
	awaitState(t, client, creating, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)

	// Exactly the two running workspaces have containers.
	out, err := exec.Command("runc", "--root", filepath.Join(home, "runtime", "runc"), "list", "-q").Output()
	if err != nil {
		t.Fatal(err)
	}
	running := strings.Fields(string(out))
	if len(running) != 2 || !strings.Contains(string(out), available) || !strings.Contains(string(out), creating) {
		t.Errorf("containers after recovery: %v", running)
	}

	for _, id := range []string{available, stopping, creating} {
		if _, err := client.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{
			Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, WorkspaceId: id})); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{available, stopping, creating} {
		awaitState(t, client, id, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
		testutil.AssertNothingLeft(t, home, id)
	}
}

func workspaceClient(t *testing.T, home, addr string) ctrlv1connect.WorkspaceServiceClient {
	t.Helper()
	token, err := os.ReadFile(filepath.Join(home, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	return ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, "http://"+addr, connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token)))))
}

func awaitState(t *testing.T, c ctrlv1connect.WorkspaceServiceClient, id string, want ctrlv1.WorkspaceState) *ctrlv1.Workspace {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := c.GetWorkspace(context.Background(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			t.Fatalf("GetWorkspace %s: %v", id, err)
		}
		ws := resp.Msg.Workspace
		if ws.State == want {
			return ws
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace %s is %v (failure %v), want %v", id, ws.State, ws.Failure, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
