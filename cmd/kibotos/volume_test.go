package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/bearer"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

const mib = 1 << 20

// runCLI runs the kibotos CLI against the deployment on home and addr and
// returns its stdout; a failure fails the test.
func runCLI(t *testing.T, bin, home, addr string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KIBOTOS_HOME="+home, "KIBOTOS_ADDR="+addr)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kibotos %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// TestVolumeThroughTheCLISurvivesKill drives a Volume through the CLI of
// the real binary and kills `kibotos up` with SIGKILL at moments spread
// over the Volume's growth: the image is always the old or the new size
// and checks clean, and the restarted deployment finishes the resize with
// the data intact.
func TestVolumeThroughTheCLISurvivesKill(t *testing.T) {
	hosttest.RequireRoot(t)
	bin := build(t)
	home := filepath.Join(t.TempDir(), "home")
	ctx := context.Background()
	up := startUp(t, bin, home, "--volume-size", "64Mi")
	run := func(args ...string) string { t.Helper(); return runCLI(t, bin, home, up.addr, args...) }

	var created ctrlv1.CreateWorkspaceResponse
	if err := protojson.Unmarshal([]byte(run("ws", "create", "--memory", "128Mi", "--disk", "64Mi", "--volume", "NEW", "--wait", "-o", "json")), &created); err != nil {
		t.Fatal(err)
	}
	ws := created.Workspace.WorkspaceId
	vol := created.Workspace.Spec.GetVolume().GetVolumeId()
	if vol == "" || created.Workspace.Spec.Volume.MountPath != "/data" {
		t.Fatalf("ws create --volume NEW: %v", created.Workspace.Spec.GetVolume())
	}
	want := run("ws", "exec", ws, "--", "sh", "-c", "head -c 16777216 /dev/urandom > /data/blob && sync && sha256sum /data/blob")
	if list := run("volume", "list"); !strings.Contains(list, vol) || !strings.Contains(list, "ATTACHED") {
		t.Errorf("volume list:\n%s", list)
	}
	run("ws", "stop", ws, "--wait")

	image := filepath.Join(home, "volumes", vol+".ext4")
	temps := filepath.Join(home, "volumes", "."+vol+".ext4.tmp-*")
	capacity := uint64(64 * mib)
	outcomes := map[string]int{}
	for i, delay := range []time.Duration{0, 5, 15, 30, 50, 80, 120, 200, 400} {
		target := capacity + 256*mib
		run("volume", "resize", vol, formatMiB(target))
		time.Sleep(delay * time.Millisecond)
		up.kill()
		fi, err := os.Stat(image)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		switch uint64(fi.Size()) {
		case capacity:
			outcomes["old size"]++
		case target:
			outcomes["new size"]++
		default:
			t.Fatalf("round %d: the image is %d bytes, neither %d nor %d", i, fi.Size(), capacity, target)
		}
		if left, _ := filepath.Glob(temps); len(left) > 0 {
			outcomes["during the copy's growth"]++
		}
		if out, err := exec.Command("e2fsck", "-fn", image).CombinedOutput(); err != nil {
			t.Fatalf("round %d, killed after %v: e2fsck: %v\n%s", i, delay, err, out)
		}
		up = startUp(t, bin, home, "--volume-size", "64Mi")
		vols := volumeClient(t, home, up.addr)
		deadline := time.Now().Add(30 * time.Second)
		for {
			var have *ctrlv1.Volume
			resp, err := vols.GetVolume(ctx, connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: vol}))
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
	if left, _ := filepath.Glob(temps); len(left) > 0 {
		t.Errorf("temporary images left: %v", left)
	}

	run("ws", "start", ws, "--wait")
	if got := run("ws", "exec", ws, "--", "sha256sum", "/data/blob"); got != want {
		t.Errorf("after the kills the data reads %q, want %q", got, want)
	}
	if got := run("ws", "exec", ws, "--", "sh", "-c", "df -k /data | tail -1"); !strings.Contains(got, "/data") {
		t.Errorf("df: %q", got)
	}
	run("ws", "delete", ws, "--wait")
	var got ctrlv1.GetVolumeResponse
	if err := protojson.Unmarshal([]byte(run("volume", "get", vol, "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Volume.State != ctrlv1.VolumeState_VOLUME_STATE_DELETING && got.Volume.State != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
		t.Errorf("the NEW volume after its workspace's deletion: %v", got.Volume)
	}
}

// formatMiB is a size as the CLI takes it.
func formatMiB(n uint64) string { return strconv.FormatUint(n/mib, 10) + "Mi" }

func volumeClient(t *testing.T, home, addr string) ctrlv1connect.VolumeServiceClient {
	t.Helper()
	token, err := os.ReadFile(filepath.Join(home, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	return ctrlv1connect.NewVolumeServiceClient(http.DefaultClient, "http://"+addr, connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token)))))
}
