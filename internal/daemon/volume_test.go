package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// volumeEnv is a deployment with two storage pools and small volumes.
type volumeEnv struct {
	*deployment
	ctx     context.Context
	volumes ctrlv1connect.VolumeServiceClient
	admin   adminv1connect.AdminServiceClient
}

func newVolumeEnv(t *testing.T) *volumeEnv {
	home := t.TempDir()
	d := upWith(t, home, daemon.Options{VolumeBytes: 64 * mib, StoragePools: []string{
		"default=" + filepath.Join(home, "pool-default"), "spare=" + filepath.Join(home, "pool-spare")}})
	token, err := os.ReadFile(filepath.Join(home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	auth := connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token))))
	return &volumeEnv{deployment: d, ctx: context.Background(),
		volumes: ctrlv1connect.NewVolumeServiceClient(http.DefaultClient, d.url, auth),
		admin:   adminv1connect.NewAdminServiceClient(http.DefaultClient, d.url, auth)}
}

func (e *volumeEnv) getVolume(id string) (*ctrlv1.Volume, error) {
	resp, err := unary(e.ctx, e.volumes.GetVolume, &ctrlv1.GetVolumeRequest{VolumeId: id})
	return resp.GetVolume(), err
}

func (e *volumeEnv) volume(id string) *ctrlv1.Volume {
	e.t.Helper()
	v, err := e.getVolume(id)
	if err != nil {
		e.t.Fatalf("GetVolume: %v", err)
	}
	return v
}

// awaitVolume polls until cond holds of the volume.
func (e *volumeEnv) awaitVolume(id, what string, cond func(*ctrlv1.Volume) bool) *ctrlv1.Volume {
	e.t.Helper()
	return eventually(e.t, 30*time.Second, "volume "+id+" "+what, func() (*ctrlv1.Volume, error) { return e.getVolume(id) }, cond)
}

func (e *volumeEnv) createVolume(spec *ctrlv1.VolumeSpec, labels map[string]string) (*ctrlv1.Volume, error) {
	resp, err := unary(e.ctx, e.volumes.CreateVolume, &ctrlv1.CreateVolumeRequest{Command: cmd(), Spec: spec, Labels: labels})
	return resp.GetVolume(), err
}

func (e *volumeEnv) resize(id string, bytes uint64) (*ctrlv1.Volume, error) {
	resp, err := unary(e.ctx, e.volumes.ResizeVolume, &ctrlv1.ResizeVolumeRequest{Command: cmd(), VolumeId: id, CapacityBytes: bytes})
	return resp.GetVolume(), err
}

func (e *volumeEnv) bind(ws *ctrlv1.Workspace, b *ctrlv1.WorkspaceVolumeBinding) (*ctrlv1.Workspace, error) {
	resp, err := unary(e.ctx, e.client.UpdateWorkspaceVolumeBinding, &ctrlv1.UpdateWorkspaceVolumeBindingRequest{
		Command: cmd(), WorkspaceId: ws.WorkspaceId, ExpectedBindingRevision: ws.Spec.BindingRevision, Volume: b})
	return resp.GetWorkspace(), err
}

func (e *volumeEnv) start(id string) (*ctrlv1.Workspace, error) {
	resp, err := unary(e.ctx, e.client.StartWorkspace, &ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: id})
	return resp.GetWorkspace(), err
}

func (e *volumeEnv) deleteWorkspace(id string) {
	e.t.Helper()
	if _, err := e.client.DeleteWorkspace(e.ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: id})); err != nil {
		e.t.Fatal(err)
	}
	e.await(id, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
}

// run runs a shell command in the workspace and fails the test on error.
func (e *volumeEnv) run(ws *ctrlv1.Workspace, script string) string {
	e.t.Helper()
	out, err := e.exec(ws, "sh", "-c", script)
	if err != nil {
		e.t.Fatalf("%s: %v: %s", script, err, out)
	}
	return strings.TrimSpace(out)
}

func withVolume(b *ctrlv1.WorkspaceVolumeBinding) *ctrlv1.WorkspaceCreateSpec {
	s := small()
	s.Volume = b
	return s
}

func bound(id, path string) *ctrlv1.WorkspaceVolumeBinding {
	return &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: id, MountPath: path}
}

var none = &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE}

// TestVolumeData follows one Volume's data through everything that must
// keep it: stop and start, a FORCE stop, growth, the deletion of a
// workspace that does not delete it, and a rebind to another workspace.
func TestVolumeData(t *testing.T) {
	e := newVolumeEnv(t)
	defer e.stop()

	ws := e.create(withVolume(&ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW}))
	b := ws.Spec.Volume
	if b.Mode != ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND || b.VolumeId == "" || b.MountPath != "/data" || !b.GetDeleteWithWorkspace() {
		t.Fatalf("stored NEW binding: %v", b)
	}
	if got := ws.PersistentPaths; len(got) != 1 || got[0] != "/data" {
		t.Errorf("persistent_paths %v", got)
	}
	volID := b.VolumeId
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	v := e.awaitVolume(volID, "ATTACHED and HEALTHY", func(v *ctrlv1.Volume) bool {
		return v.State == ctrlv1.VolumeState_VOLUME_STATE_ATTACHED && v.Observation.GetCondition() == ctrlv1.VolumeCondition_VOLUME_CONDITION_HEALTHY
	})
	if v.Spec.CapacityBytes != 64*mib || v.Spec.StoragePool != "default" || v.BoundWorkspaceId != ws.WorkspaceId {
		t.Errorf("volume %v", v)
	}
	promised := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED)
	if promised.GetAvailability() != ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_AVAILABLE ||
		len(promised.Paths) != 1 || promised.Paths[0] != "/data" || promised.GetCapacityBytes() != 64*mib {
		t.Errorf("PROMISED tier %v", promised)
	}

	if !heldInFull(t, filepath.Join(e.home, "pool-default", volID+".ext4")) {
		t.Error("the image of a mounted volume is not held in full on the host's disk")
	}
	// The capacity is the volume's: writing past it fails with no space,
	// and nothing else breaks.
	e.run(ws, "echo one > /data/f && sync")
	out, err := e.exec(ws, "sh", "-c", "dd if=/dev/zero of=/data/big bs=1M count=100 2>&1")
	if err == nil || !strings.Contains(out, "No space left") {
		t.Errorf("writing 100 MiB into a 64 MiB volume: %v %s", err, out)
	}
	if got := e.run(ws, "rm /data/big && echo fine > /root/other && cat /root/other /data/f"); got != "fine\none" {
		t.Errorf("after filling the volume: %q", got)
	}

	// A second binding of a bound volume is refused, naming the holder.
	_, err = e.client.CreateWorkspace(e.ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: withVolume(bound(volID, ""))}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || testutil.ErrorDetail(err).GetObservedWorkspace().GetWorkspaceId() != ws.WorkspaceId {
		t.Errorf("binding a bound volume: %v", err)
	}
	// Growing it while mounted is refused here, with the reason.
	if _, err := e.resize(volID, 96*mib); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "stop the workspace") ||
		strings.Contains(err.Error(), e.home) {
		t.Errorf("online resize: %v, want failed_precondition saying to stop the workspace, naming no host path", err)
	}
	if _, err := e.volumes.DeleteVolume(e.ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Command: cmd(), VolumeId: volID})); connect.CodeOf(err) != connect.CodeFailedPrecondition || testutil.ErrorDetail(err).GetObservedWorkspace() == nil {
		t.Errorf("deleting a bound volume: %v", err)
	}

	// NORMAL stop, start: the data is there.
	e.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	e.awaitVolume(volID, "AVAILABLE", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE })
	if _, err := e.start(ws.WorkspaceId); err != nil {
		t.Fatal(err)
	}
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if got := e.run(ws, "cat /data/f; echo two > /data/f; sync"); got != "one" {
		t.Errorf("after stop/start: %q", got)
	}
	// FORCE stop: synced data survives and the filesystem mounts again.
	e.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_FORCE)
	e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	e.awaitVolume(volID, "AVAILABLE", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE })

	// Grow it while stopped: RESIZING, then the new capacity.
	for name, bytes := range map[string]uint64{"shrinking": 32 * mib, "not whole MiB": 96*mib + 1} {
		if _, err := e.resize(volID, bytes); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("resize %s: %v", name, err)
		}
	}
	got, err := e.resize(volID, 96*mib)
	if err != nil || got.State != ctrlv1.VolumeState_VOLUME_STATE_RESIZING || got.Spec.CapacityBytes != 64*mib || got.Observation != nil {
		t.Fatalf("resize: %v, %v", got, err)
	}
	grown := e.awaitVolume(volID, "grown to 96 MiB", func(v *ctrlv1.Volume) bool {
		return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE && v.Spec.CapacityBytes == 96*mib
	})
	// What its data uses, read from the image while nothing mounts it,
	// leaves the filesystem's own structures out, as a mount's df does:
	// it holds a file of 4 bytes.
	if used := grown.Observation.GetUsedBytes(); used > 64<<10 {
		t.Errorf("a detached volume holding a 4-byte file uses %d bytes", used)
	}
	if _, err := e.start(ws.WorkspaceId); err != nil {
		t.Fatal(err)
	}
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if got := e.run(ws, "cat /data/f"); got != "two" {
		t.Errorf("after FORCE stop and growth: %q", got)
	}
	// The guest sees the larger filesystem (df counts 1K blocks).
	var blocks int
	if fields := strings.Fields(e.run(ws, "df -k /data | tail -1")); len(fields) > 1 {
		blocks, _ = strconv.Atoi(fields[1])
	}
	if blocks < 80*1024 || blocks > 96*1024 {
		t.Errorf("the guest's /data has %d KiB, want about 96 MiB", blocks)
	}
	if p := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED); p.GetCapacityBytes() != 96*mib {
		t.Errorf("PROMISED tier after growth: %v", p)
	}

	// Release it (the binding's delete_with_workspace does not matter
	// for a release), then bind it to a second workspace.
	e.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if _, err := e.bind(ws, &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("NEW in UpdateWorkspaceVolumeBinding: %v", err)
	}
	stale := proto.CloneOf(ws)
	released, err := e.bind(ws, none)
	if err != nil || released.Spec.BindingRevision != 2 || len(released.PersistentPaths) != 0 ||
		testutil.RetentionTier(released, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED).GetAvailability() != ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_NOT_DECLARED {
		t.Fatalf("release: %v, %v", released, err)
	}
	if _, err := e.bind(stale, bound(volID, "")); connect.CodeOf(err) != connect.CodeAborted {
		t.Errorf("stale binding_revision: %v", err)
	}
	if v := e.volume(volID); v.BoundWorkspaceId != "" || v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		t.Errorf("released volume: %v", v)
	}
	second := e.create(withVolume(bound(volID, "/mnt/keep")))
	if !proto.Equal(second.Spec.Volume, &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND,
		VolumeId: volID, MountPath: "/mnt/keep", DeleteWithWorkspace: proto.Bool(false)}) {
		t.Errorf("stored BOUND binding: %v", second.Spec.Volume)
	}
	second = e.await(second.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if got := e.run(second, "cat /mnt/keep/f"); got != "two" {
		t.Errorf("in the second workspace: %q", got)
	}
	// Deleting it keeps the volume: its binding says so.
	e.deleteWorkspace(second.WorkspaceId)
	v = e.awaitVolume(volID, "free", func(v *ctrlv1.Volume) bool {
		return v.BoundWorkspaceId == "" && v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE
	})
	// Bound again to the first, whose binding deletes it with itself.
	ws, err = e.bind(released, &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND,
		VolumeId: volID, DeleteWithWorkspace: proto.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(ws.WorkspaceId); err != nil {
		t.Fatal(err)
	}
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if got := e.run(ws, "cat /data/f"); got != "two" {
		t.Errorf("rebound: %q", got)
	}
	image := filepath.Join(e.home, "pool-default", volID+".ext4")
	if _, err := os.Stat(image); err != nil {
		t.Fatal(err)
	}
	e.deleteWorkspace(ws.WorkspaceId)
	e.awaitVolume(volID, "DELETED", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_DELETED })
	if _, err := os.Stat(image); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted volume's image: %v", err)
	}
}

// TestVolumeLostAndDamaged covers the operator declaring a pool lost and
// a holder that cannot open a volume as the one created.
func TestVolumeLostAndDamaged(t *testing.T) {
	e := newVolumeEnv(t)
	defer e.stop()

	// Bad input is refused and stores nothing.
	for name, spec := range map[string]*ctrlv1.VolumeSpec{
		"capacity not whole MiB": {CapacityBytes: mib + 1},
		"bad pool name":          {StoragePool: "Not A Pool"},
	} {
		if _, err := e.createVolume(spec, nil); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := e.createVolume(&ctrlv1.VolumeSpec{StoragePool: "elsewhere"}, nil); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown pool: %v", err)
	}
	if _, err := e.createVolume(nil, map[string]string{"Bad Key": "x"}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("bad label: %v", err)
	}
	for name, b := range map[string]*ctrlv1.WorkspaceVolumeBinding{
		"relative mount_path":  {Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, MountPath: "data"},
		"root mount_path":      {Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, MountPath: "/"},
		"over /run/kibotos":    {Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, MountPath: "/run"},
		"inside /proc":         {Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, MountPath: "/data/../proc/x"},
		"NEW with a volume_id": {Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, VolumeId: "vol_x"},
		"BOUND without one":    {Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND},
		"NONE with a path":     {Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE, MountPath: "/data"},
		"NONE with delete":     {Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE, DeleteWithWorkspace: proto.Bool(false)},
	} {
		_, err := e.client.CreateWorkspace(e.ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: withVolume(b)}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := e.client.CreateWorkspace(e.ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: withVolume(bound("vol_missing", ""))})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("binding a missing volume: %v", err)
	}
	list, err := e.volumes.ListVolumes(e.ctx, connect.NewRequest(&ctrlv1.ListVolumesRequest{}))
	if err != nil || len(list.Msg.Volumes) != 0 {
		t.Fatalf("volumes after bad input: %v, %v", list, err)
	}
	ws, err := e.client.ListWorkspaces(e.ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
	if err != nil || len(ws.Msg.Workspaces) != 0 {
		t.Fatalf("workspaces after bad input: %v, %v", ws, err)
	}

	// A volume in the spare pool, created on its own.
	lost, err := e.createVolume(&ctrlv1.VolumeSpec{StoragePool: "spare", CapacityBytes: 32 * mib}, map[string]string{"team": "a"})
	if err != nil || lost.State != ctrlv1.VolumeState_VOLUME_STATE_CREATING || lost.Spec.CapacityBytes != 32*mib {
		t.Fatalf("CreateVolume: %v, %v", lost, err)
	}
	e.awaitVolume(lost.VolumeId, "AVAILABLE", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE })
	holder := e.create(withVolume(bound(lost.VolumeId, "/srv")))
	holder = e.await(holder.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	e.run(holder, "echo x > /srv/x")
	e.stopWorkspace(holder.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	holder = e.await(holder.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)

	// A damaged image: its superblock overwritten while nothing holds it.
	damaged := e.create(withVolume(&ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW}))
	damaged = e.await(damaged.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	e.stopWorkspace(damaged.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	damaged = e.await(damaged.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	damagedVol := damaged.Spec.Volume.VolumeId
	e.awaitVolume(damagedVol, "AVAILABLE", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE })
	f, err := os.OpenFile(filepath.Join(e.home, "pool-default", damagedVol+".ext4"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 1024), 1024); err != nil {
		t.Fatal(err)
	}
	f.Close()
	v := e.awaitVolume(damagedVol, "DAMAGED", func(v *ctrlv1.Volume) bool {
		return v.Observation.GetCondition() == ctrlv1.VolumeCondition_VOLUME_CONDITION_DAMAGED
	})
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.Observation.Error == "" || v.Observation.ObservedAt == nil {
		t.Errorf("damaged volume: %v", v)
	}
	if _, err := e.start(damaged.WorkspaceId); err != nil {
		t.Fatal(err)
	}
	failed := e.awaitWorkspace(damaged.WorkspaceId, "the start on a damaged volume to fail", func(w *ctrlv1.Workspace) bool {
		return w.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
	})
	if !strings.Contains(failed.Failure.GetMessage(), "cannot be opened as the volume created") ||
		failed.Failure.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE {
		t.Errorf("failure: %v", failed.Failure)
	}
	// Its image gone, as on a host back with an emptied pool directory: the
	// failure says so and what an operator can do.
	if err := os.Remove(filepath.Join(e.home, "pool-default", damagedVol+".ext4")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(damaged.WorkspaceId); err != nil {
		t.Fatal(err)
	}
	failed = e.awaitWorkspace(damaged.WorkspaceId, "the start on a missing volume image to fail", func(w *ctrlv1.Workspace) bool {
		return w.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED && strings.Contains(w.Failure.GetMessage(), "missing")
	})
	if msg := failed.Failure.GetMessage(); !strings.Contains(msg, `its image is missing from storage pool "default" on host`) ||
		!strings.Contains(msg, "kibotos admin pool lost default --host ") || failed.Failure.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE {
		t.Errorf("failure with the image missing: %v", failed.Failure)
	}

	// The operator declares the spare pool lost.
	pools, err := e.admin.ListStoragePools(e.ctx, connect.NewRequest(&adminv1.ListStoragePoolsRequest{}))
	if err != nil || len(pools.Msg.StoragePools) != 2 || !pools.Msg.StoragePools[0].Default || pools.Msg.StoragePools[1].Name != "spare" {
		t.Fatalf("pools: %v, %v", pools, err)
	}
	// One host reaches it: the declaration need not name it, and says it.
	declared, err := e.admin.DeclareStoragePoolLost(e.ctx, connect.NewRequest(&adminv1.DeclareStoragePoolLostRequest{StoragePool: "spare"}))
	if err != nil || len(declared.Msg.LostVolumeIds) != 1 || declared.Msg.LostVolumeIds[0] != lost.VolumeId ||
		!slices.Equal([]string{declared.Msg.HostId}, pools.Msg.StoragePools[1].HostIds) {
		t.Fatalf("DeclareStoragePoolLost: %v, %v", declared, err)
	}
	if v := e.volume(lost.VolumeId); v.State != ctrlv1.VolumeState_VOLUME_STATE_LOST {
		t.Errorf("lost volume: %v", v)
	}
	if v := e.volume(damagedVol); v.State == ctrlv1.VolumeState_VOLUME_STATE_LOST {
		t.Errorf("a volume of another pool is LOST")
	}
	_, err = e.start(holder.WorkspaceId)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || testutil.ErrorDetail(err).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_VOLUME_LOST {
		t.Errorf("start bound to a LOST volume: %v", err)
	}
	if _, err := e.resize(lost.VolumeId, 64*mib); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("resize LOST: %v", err)
	}
	if _, err := e.volumes.UpdateVolumeLabels(e.ctx, connect.NewRequest(&ctrlv1.UpdateVolumeLabelsRequest{Command: cmd(),
		VolumeId: lost.VolumeId, ExpectedLabelsRevision: 1})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("labels of a LOST volume: %v", err)
	}
	// Rebinding the workspace lets it start; the LOST volume is deletable
	// and stays readable with its labels.
	holder, err = e.bind(holder, none)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(holder.WorkspaceId); err != nil {
		t.Fatal(err)
	}
	e.await(holder.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	del, err := e.volumes.DeleteVolume(e.ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Command: cmd(), VolumeId: lost.VolumeId}))
	if err != nil || del.Msg.Volume.State != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
		t.Fatalf("delete LOST: %v, %v", del, err)
	}
	if v := e.volume(lost.VolumeId); v.Labels["team"] != "a" || v.State != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
		t.Errorf("deleted volume read back: %v", v)
	}
}

// TestVolumesFitTheirPool: a volume, or a growth, that would make the
// pool's volumes add up to more than the pool's filesystem can give is
// refused (resource_exhausted) and changes nothing: volumes are sparse,
// and one filled by its guest must not fill the disk under every other.
func TestVolumesFitTheirPool(t *testing.T) {
	e := newVolumeEnv(t)
	defer e.stop()
	free := hosttest.FreeBytes(t, filepath.Join(e.home, "pool-default"))
	const gib = 1024 * mib
	// Room to spare for what other tests write meanwhile: the pool's
	// room is its free space when the host registered.
	const drift = 4 * gib
	if free < 6*drift || free+4*drift > 16<<40-mib {
		t.Skipf("the pool's filesystem has %d bytes free", free)
	}
	before, err := unary(e.ctx, e.volumes.ListVolumes, &ctrlv1.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.createVolume(&ctrlv1.VolumeSpec{CapacityBytes: (free/mib)*mib + 4*drift}, nil); connect.CodeOf(err) != connect.CodeResourceExhausted ||
		!strings.Contains(err.Error(), "storage pool default cannot give a volume") {
		t.Errorf("a volume larger than the pool's free space: %v", err)
	}
	if after, err := unary(e.ctx, e.volumes.ListVolumes, &ctrlv1.ListVolumesRequest{}); err != nil || len(after.Volumes) != len(before.Volumes) {
		t.Errorf("volumes after the refusal: %v, %v", after.GetVolumes(), err)
	}

	// Two halves fit; a third volume does not, nor growing one past the
	// rest.
	half := (free/2/mib)*mib - drift/2
	var ids []string
	for range 2 {
		v, err := e.createVolume(&ctrlv1.VolumeSpec{CapacityBytes: half}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.VolumeId)
	}
	if _, err := e.createVolume(&ctrlv1.VolumeSpec{CapacityBytes: 2 * drift}, nil); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a volume beyond the two halves: %v", err)
	}
	v := e.awaitVolume(ids[0], "AVAILABLE", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE })
	if _, err := e.resize(ids[0], half+2*drift); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("growing a volume past the pool: %v", err)
	}
	if got := e.volume(ids[0]); got.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || got.Spec.CapacityBytes != v.Spec.CapacityBytes {
		t.Errorf("the refused growth changed the volume: %v", got)
	}
	// Deleting one gives its room back.
	if _, err := e.volumes.DeleteVolume(e.ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Command: cmd(), VolumeId: ids[1]})); err != nil {
		t.Fatal(err)
	}
	e.awaitVolume(ids[1], "DELETED", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_DELETED })
	if _, err := e.resize(ids[0], half+2*drift); err != nil {
		t.Errorf("growing once the other volume was deleted: %v", err)
	}
}

// TestVolumeFailureNamesNoHostPath: a Volume whose offline resize fails
// (its guest made /lost+found a file, which e2fsck will not repair on
// its own) keeps its data and capacity, and its failure says why without
// a path of the host's: the tenant reads it, the host's log has it whole.
func TestVolumeFailureNamesNoHostPath(t *testing.T) {
	e := newVolumeEnv(t)
	defer e.stop()
	ws := e.create(withVolume(&ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW}))
	volID := ws.Spec.Volume.VolumeId
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	e.run(ws, "rm -rf /data/lost+found && echo kept > /data/lost+found && sync")
	e.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	e.awaitVolume(volID, "AVAILABLE", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE })
	if _, err := e.resize(volID, 96*mib); err != nil {
		t.Fatal(err)
	}
	v := e.awaitVolume(volID, "a failed resize", func(v *ctrlv1.Volume) bool {
		return v.GetFailure().GetStage() == ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME
	})
	if msg := v.Failure.GetMessage(); strings.Contains(msg, e.home) || strings.Contains(msg, "/dev/loop") ||
		!strings.Contains(msg, "<storage pool default>") || !strings.Contains(msg, "/lost+found is not a directory") {
		t.Errorf("the failure's message %q: want why, and no host path", msg)
	}
	if v.Spec.CapacityBytes != 64*mib {
		t.Errorf("a failed resize left the capacity %d", v.Spec.CapacityBytes)
	}
}
