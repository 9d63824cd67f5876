package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/bearer"
	"github.com/kibotos/kibotos/internal/daemon"
)

// The deployment a child process of this test binary runs: its home, and
// the guest agent it uses.
const (
	childHomeEnv  = "KIBOTOS_TEST_CHILD_HOME"
	childGuestEnv = "KIBOTOS_TEST_CHILD_GUEST"
	childAddrFile = "listen-addr"
)

// runChild runs `kibotos up` on home until SIGTERM, writing the address it
// listens on to home/listen-addr.
func runChild(home string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := daemon.Run(ctx, daemon.Options{Home: home, Listen: "127.0.0.1:0", Host: true,
		GuestAgent: os.Getenv(childGuestEnv), VolumeBytes: 64 * mib,
		Ready: func(a net.Addr) {
			os.WriteFile(filepath.Join(home, childAddrFile), []byte(a.String()), 0o600)
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// child is a deployment in a process of its own, so that it can be killed.
type child struct {
	t      *testing.T
	home   string
	cmd    *exec.Cmd
	client ctrlv1connect.WorkspaceServiceClient
	vols   ctrlv1connect.VolumeServiceClient
}

func startChild(t *testing.T, home string) *child {
	t.Helper()
	os.Remove(filepath.Join(home, childAddrFile))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childHomeEnv+"="+home, childGuestEnv+"="+guestAgent)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, home: home, cmd: cmd}
	deadline := time.Now().Add(30 * time.Second)
	for {
		addr, err := os.ReadFile(filepath.Join(home, childAddrFile))
		if err == nil && len(addr) > 0 {
			token, err := os.ReadFile(filepath.Join(home, daemon.AdminTokenFile))
			if err != nil {
				t.Fatal(err)
			}
			auth := connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token))))
			url := "http://" + string(addr)
			c.client = ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, auth)
			c.vols = ctrlv1connect.NewVolumeServiceClient(http.DefaultClient, url, auth)
			return c
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the deployment process did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill ends the process with SIGKILL.
func (c *child) kill() {
	c.cmd.Process.Kill()
	c.cmd.Wait()
}

// stop deletes every workspace, so that no container outlives the test,
// and ends the process normally.
func (c *child) stop() {
	ctx := context.Background()
	if list, err := c.client.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{})); err == nil {
		for _, ws := range list.Msg.Workspaces {
			c.client.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}))
			c.awaitWorkspace(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
		}
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	c.cmd.Wait()
}

func (c *child) awaitWorkspace(id string, state ctrlv1.WorkspaceState) *ctrlv1.Workspace {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var have *ctrlv1.Workspace
		resp, err := c.client.GetWorkspace(context.Background(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err == nil {
			if have = resp.Msg.Workspace; have.State == state {
				return have
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("workspace %s: want %v, have %v, %v", id, state, have, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestVolumeResizeSurvivesKill kills the deployment with SIGKILL at
// moments spread over a volume's growth: the image is always the old or
// the new size and checks clean, and the restarted deployment finishes
// the resize with the data intact.
func TestVolumeResizeSurvivesKill(t *testing.T) {
	requireRoot(t)
	home := t.TempDir()
	c := startChild(t, home)
	defer func() { c.stop() }()
	ctx := context.Background()

	created, err := c.client.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(),
		Spec: withVolume(&ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW})}))
	if err != nil {
		t.Fatal(err)
	}
	ws := c.awaitWorkspace(created.Msg.Workspace.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	volID := ws.Spec.Volume.VolumeId
	image := filepath.Join(home, "volumes", volID+".ext4")
	driver := (&deployment{t: t, home: home}).driver()
	run := func(ws *ctrlv1.Workspace, script string) string {
		t.Helper()
		out, err := driver.Exec(ctx, fmt.Sprintf("%s-%d", ws.WorkspaceId, ws.Generation), "sh", "-c", script)
		if err != nil {
			t.Fatalf("%s: %v: %s", script, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	want := run(ws, "head -c 16777216 /dev/urandom > /data/blob && sync && sha256sum /data/blob")
	if _, err := c.client.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
		t.Fatal(err)
	}
	c.awaitWorkspace(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)

	capacity := uint64(64 * mib)
	outcomes := map[string]int{}
	for i, delay := range []time.Duration{0, 5, 15, 30, 50, 80, 120, 200, 400} {
		target := capacity + 256*mib
		if _, err := c.vols.ResizeVolume(ctx, connect.NewRequest(&ctrlv1.ResizeVolumeRequest{Command: cmd(), VolumeId: volID, CapacityBytes: target})); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		time.Sleep(delay * time.Millisecond)
		c.kill()
		fi, err := os.Stat(image)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		switch uint64(fi.Size()) {
		case capacity:
			outcomes["old"]++
		case target:
			outcomes["new"]++
		default:
			t.Fatalf("round %d: the image is %d bytes, neither %d nor %d", i, fi.Size(), capacity, target)
		}
		if temps, _ := filepath.Glob(filepath.Join(filepath.Dir(image), "."+filepath.Base(image)+".tmp-*")); len(temps) > 0 {
			outcomes["during the copy's growth"]++
		}
		if out, err := exec.Command("e2fsck", "-fn", image).CombinedOutput(); err != nil {
			t.Fatalf("round %d, killed after %v: e2fsck: %v\n%s", i, delay, err, out)
		}
		c = startChild(t, home)
		deadline := time.Now().Add(30 * time.Second)
		for {
			var have *ctrlv1.Volume
			resp, err := c.vols.GetVolume(ctx, connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: volID}))
			if err == nil {
				if have = resp.Msg.Volume; have.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE && have.Spec.CapacityBytes == target {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the restarted deployment did not finish the resize: %v, %v", i, have, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		capacity = target
	}
	t.Logf("killed during growth: %v", outcomes)
	if _, err := c.client.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
		t.Fatal(err)
	}
	ws = c.awaitWorkspace(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if got := run(ws, "sha256sum /data/blob"); got != want {
		t.Errorf("after the kills the data reads %q, want %q", got, want)
	}
	if _, err := os.Stat(image); errors.Is(err, os.ErrNotExist) {
		t.Fatal("image gone")
	}
}
