package daemon_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// heldInFull reports whether the image at path holds a block of the
// host's disk for every block of its size.
func heldInFull(t *testing.T, path string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks*512 >= st.Size
}

// TestAFullHostDiskLosesNoWrite: a workspace's writable layer is held in
// full on the host's disk from its start. Its image used to stay sparse:
// once something else (template blobs, an export, an operator's files)
// filled the host's disk, the guest's next write into a block it had not
// written before failed on the host, its filesystem aborted its journal,
// and the workspace stayed AVAILABLE with a read-only root. Now that write
// succeeds, the workspace stops CONFIRMED and starts again with its data
// on the full disk, and a new workspace the disk cannot hold fails to
// start, RESOURCE_EXHAUSTED, saying why.
func TestAFullHostDiskLosesNoWrite(t *testing.T) {
	home := t.TempDir()
	hosttest.Tmpfs(t, home, "384m")
	d := up(t, home)
	defer d.stop()
	ws := d.await(d.create(small()).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if !heldInFull(t, filepath.Join(home, "layers", ws.WorkspaceId+".ext4")) {
		t.Error("the layer of a started workspace is not held in full")
	}
	// What is left holds a new layer's filesystem, not its whole size.
	defer hosttest.FillDisk(t, home, 8*mib)() // before the deployment's stop deletes the workspaces

	sum, err := d.exec(ws, "sh", "-c", "head -c 41943040 /dev/urandom > /root/data && sync && md5sum /root/data")
	if err != nil {
		t.Fatalf("writing 40 MiB into a 64 MiB layer on a full host disk: %v %s", err, sum)
	}
	d.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if ls := ws.LastStop; ls.GetDurability() != ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED {
		t.Errorf("normal stop on a full host disk: %v", ls)
	}
	mustUnary(t, d.client.StartWorkspace, &ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if again, err := d.exec(ws, "md5sum", "/root/data"); err != nil || again != sum {
		t.Errorf("after a restart on the full disk: %q, %v, want %q", again, err, sum)
	}

	next := d.await(d.create(small()).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED)
	if f := next.Failure; f.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED ||
		!strings.Contains(f.GetMessage(), "the host's disk has") || strings.Contains(f.GetMessage(), home) {
		t.Errorf("a workspace the full disk cannot hold: %v, want RESOURCE_EXHAUSTED naming the host's disk and no host path", f)
	}
}

// TestAdoptedImagesHeldInFull: a workspace that an earlier build started,
// with its layer and Volume images sparse, and that runs on across the
// upgrade, has both held in full once the new build adopts it.
func TestAdoptedImagesHeldInFull(t *testing.T) {
	home := t.TempDir()
	pools := []string{"default=" + filepath.Join(home, "pool-default")}
	d := upWith(t, home, daemon.Options{VolumeBytes: 64 * mib, StoragePools: pools})
	ws := d.await(d.create(withVolume(&ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW})).WorkspaceId,
		ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	images := []string{filepath.Join(home, "layers", ws.WorkspaceId+".ext4"), filepath.Join(home, "pool-default", ws.Spec.Volume.VolumeId+".ext4")}
	d.cancel() // the host stops; its execution runs on
	if err := <-d.done; err != nil {
		t.Fatal(err)
	}
	// As the earlier build left them: the blocks never written are holes.
	for _, image := range images {
		if out, err := exec.Command("fallocate", "--dig-holes", image).CombinedOutput(); err != nil {
			t.Fatalf("fallocate --dig-holes: %v: %s", err, out)
		}
		if heldInFull(t, image) {
			t.Fatalf("%s is still held in full: nothing to test", image)
		}
	}
	d = upWith(t, home, daemon.Options{VolumeBytes: 64 * mib, StoragePools: pools})
	defer d.stop()
	eventually(t, 30*time.Second, "the adopted execution's images held in full", func() (bool, error) {
		return heldInFull(t, images[0]) && heldInFull(t, images[1]), nil
	}, func(held bool) bool { return held })
	if got := d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE); got.Generation != 1 {
		t.Errorf("the adopted workspace is at generation %d, want 1", got.Generation)
	}
}
