package workspaces

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/testutil"
)

// newVolumeService is newService with Volumes: host h1 reaches pool
// "default" (no online growth) and "fast" (online growth), and h2, which
// has more memory free, reaches none.
func newVolumeService(t *testing.T) (*Service, context.Context) {
	t.Helper()
	s, ctx := newService(t)
	s.Volumes = &volumes.Service{Store: s.Store, Pages: s.Pages, DefaultPool: "default", InUse: InUse, Changes: changes.NewBroker()}
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib},
		StoragePools: []*hostv1.StoragePool{
			{Name: "default", DefaultVolumeBytes: 256 * MiB, OnlineGrowRefusal: "refused here"},
			{Name: "fast", DefaultVolumeBytes: 128 * MiB, OnlineGrow: true}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h2", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: 8 * gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	return s, ctx
}

func newVol() *ctrlv1.Volume { return new(ctrlv1.Volume) }

func volumeIdentity(v *ctrlv1.Volume) *ctrlv1.Volume { return v }

// volumeReport sends one host report about a volume and returns it as
// GetVolume does.
func volumeReport(t *testing.T, s *Service, ctx context.Context, rep *hostv1.VolumeReport) *ctrlv1.Volume {
	t.Helper()
	if err := s.Report(ctx, "h1", nil, []*hostv1.VolumeReport{rep}); err != nil {
		t.Fatal(err)
	}
	v, err := s.Volumes.Get(ctx, rep.VolumeId)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func volumeAssignment(t *testing.T, s *Service, ctx context.Context, id string) *hostv1.VolumeAssignment {
	t.Helper()
	as, err := s.Assignments(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as.Volumes {
		if a.VolumeId == id {
			return a
		}
	}
	return nil
}

func healthy(id string, capacity uint64) *hostv1.VolumeReport {
	return &hostv1.VolumeReport{VolumeId: id, CapacityBytes: capacity, Condition: ctrlv1.VolumeCondition_VOLUME_CONDITION_HEALTHY, UsedBytes: MiB}
}

func TestVolumeCreateResizeAndReports(t *testing.T) {
	s, ctx := newVolumeService(t)
	v, err := volumes.Create(ctx, s.Volumes, write("create", newVol), &ctrlv1.VolumeSpec{}, map[string]string{"a": "b"}, nil, volumeIdentity)
	if err != nil || v.State != ctrlv1.VolumeState_VOLUME_STATE_CREATING || v.Spec.CapacityBytes != 256*MiB || v.Spec.StoragePool != "default" {
		t.Fatalf("create: %v, %v", v, err)
	}
	id := v.VolumeId
	a := volumeAssignment(t, s, ctx, id)
	if a == nil || !a.Create || a.CapacityBytes != 256*MiB || a.FilesystemUuid == "" || a.Desired != hostv1.VolumeDesired_VOLUME_DESIRED_PRESENT {
		t.Fatalf("assignment while CREATING: %v", a)
	}
	v = volumeReport(t, s, ctx, healthy(id, 256*MiB))
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.Observation.GetUsedBytes() != MiB {
		t.Fatalf("created: %v", v)
	}
	// The same report again moves observed_at only once it is older than
	// the refresh, and never updated_at.
	first := v.Observation.ObservedAt.AsTime()
	if again := volumeReport(t, s, ctx, healthy(id, 256*MiB)); !again.Observation.ObservedAt.AsTime().Equal(first) {
		t.Errorf("an unchanged report at once moved observed_at from %v to %v", first, again.Observation.ObservedAt.AsTime())
	}
	s.Volumes.Now = func() time.Time { return first.Add(time.Minute) }
	again := volumeReport(t, s, ctx, healthy(id, 256*MiB))
	if !again.Observation.ObservedAt.AsTime().Equal(first.Add(time.Minute)) || !again.UpdatedAt.AsTime().Equal(v.UpdatedAt.AsTime()) {
		t.Errorf("a report a minute later: observed_at %v, updated_at %v (was %v)", again.Observation.ObservedAt.AsTime(), again.UpdatedAt.AsTime(), v.UpdatedAt.AsTime())
	}
	s.Volumes.Now = nil
	if a := volumeAssignment(t, s, ctx, id); a.Create {
		t.Errorf("create still allowed once created: %v", a)
	}

	resize := func(bytes uint64) (*ctrlv1.Volume, error) {
		return volumes.Resize(ctx, s.Volumes, write("resize", newVol), id, bytes, volumeIdentity)
	}
	v, err = resize(512 * MiB)
	if err != nil || v.State != ctrlv1.VolumeState_VOLUME_STATE_RESIZING || v.Spec.CapacityBytes != 256*MiB || v.Observation != nil {
		t.Fatalf("resize: %v, %v", v, err)
	}
	if a := volumeAssignment(t, s, ctx, id); a.CapacityBytes != 512*MiB {
		t.Errorf("assignment while RESIZING: %v", a)
	}
	if _, err := resize(1024 * MiB); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("resize while RESIZING: %v", err)
	}
	// No binding is admitted while it grows.
	_, err = Create(ctx, s, write("bind", newWS), &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 * MiB},
		Volume: &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: id}}, nil, nil, identity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("binding a RESIZING volume: %v", err)
	}
	v = volumeReport(t, s, ctx, healthy(id, 512*MiB))
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.Spec.CapacityBytes != 512*MiB {
		t.Fatalf("grown: %v", v)
	}
	// A growth the host cannot make ends the request; the volume keeps
	// what it has.
	if _, err := resize(768 * MiB); err != nil {
		t.Fatal(err)
	}
	v = volumeReport(t, s, ctx, &hostv1.VolumeReport{VolumeId: id, CapacityBytes: 512 * MiB, Condition: ctrlv1.VolumeCondition_VOLUME_CONDITION_HEALTHY,
		FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME, FailureMessage: "no space left in the pool"})
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.Spec.CapacityBytes != 512*MiB ||
		v.Failure.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME {
		t.Errorf("failed resize: %v", v)
	}
	if a := volumeAssignment(t, s, ctx, id); a.CapacityBytes != 512*MiB {
		t.Errorf("assignment after a failed resize: %v", a)
	}
	// A DAMAGED observation never moves the state.
	v = volumeReport(t, s, ctx, &hostv1.VolumeReport{VolumeId: id, CapacityBytes: 512 * MiB,
		Condition: ctrlv1.VolumeCondition_VOLUME_CONDITION_DAMAGED, Error: "bad superblock"})
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.Observation.Error != "bad superblock" {
		t.Errorf("damaged: %v", v)
	}

	del, err := volumes.Delete(ctx, s.Volumes, write("delete", newVol), id, volumeIdentity)
	if err != nil || del.State != ctrlv1.VolumeState_VOLUME_STATE_DELETING {
		t.Fatalf("delete: %v, %v", del, err)
	}
	if a := volumeAssignment(t, s, ctx, id); a.Desired != hostv1.VolumeDesired_VOLUME_DESIRED_DELETED {
		t.Errorf("assignment while DELETING: %v", a)
	}
	v = volumeReport(t, s, ctx, &hostv1.VolumeReport{VolumeId: id, Deleted: true})
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_DELETED || v.Labels["a"] != "b" {
		t.Errorf("deleted: %v", v)
	}
	if a := volumeAssignment(t, s, ctx, id); a != nil {
		t.Errorf("assignment of a DELETED volume: %v", a)
	}
}

func TestVolumeBinding(t *testing.T) {
	s, ctx := newVolumeService(t)
	// NEW: placed on the host that reaches the default pool, although the
	// other has more memory free.
	ws, err := Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 256 * MiB},
		Volume:    &ctrlv1.WorkspaceVolumeBinding{MountPath: "/srv/./data/"}}, nil, nil, identity)
	if err != nil {
		t.Fatal(err)
	}
	b := ws.Spec.Volume
	if b.Mode != ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND || b.MountPath != "/srv/data" || !b.GetDeleteWithWorkspace() {
		t.Fatalf("stored binding: %v", b)
	}
	volID := b.VolumeId
	a, err := s.Assignments(ctx, "h1")
	if err != nil || len(a.Assignments) != 1 || a.Assignments[0].Volume.GetMountPath() != "/srv/data" {
		t.Fatalf("h1 assignments: %v, %v", a, err)
	}
	v, _ := s.Volumes.Get(ctx, volID)
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_CREATING || v.BoundWorkspaceId != ws.WorkspaceId {
		t.Fatalf("NEW volume: %v", v)
	}
	if p := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED); p.Availability != ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_UNAVAILABLE || p.Paths[0] != "/srv/data" {
		t.Errorf("PROMISED tier while the volume is created: %v", p)
	}
	v = volumeReport(t, s, ctx, healthy(volID, 256*MiB))
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_ATTACHED {
		t.Fatalf("created for a starting workspace: %v", v)
	}
	ws = report(t, s, ctx, ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)

	// While it runs: no online growth on this pool, no rebinding.
	_, err = volumes.Resize(ctx, s.Volumes, write("resize", newVol), volID, 512*MiB, volumeIdentity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || testutil.ErrorDetail(err).GetObservedWorkspace().GetWorkspaceId() != ws.WorkspaceId {
		t.Errorf("online resize: %v", err)
	}
	rebind := func(ws *ctrlv1.Workspace, b *ctrlv1.WorkspaceVolumeBinding) (*ctrlv1.Workspace, error) {
		return UpdateVolumeBinding(ctx, s, write("bind", newWS), ws.WorkspaceId, ws.Spec.BindingRevision, b, identity)
	}
	none := &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE}
	if _, err := rebind(ws, none); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("rebinding a running workspace: %v", err)
	}
	if _, err := Stop(ctx, s, write("stop", newWS), ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	ws = report(t, s, ctx, ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_STOPPED, nil)
	if v, _ := s.Volumes.Get(ctx, volID); v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		t.Errorf("volume of a stopped workspace: %v", v.State)
	}
	// A binding an earlier release took at a path now reserved: the start
	// is refused, saying how to move it, rather than failing on the host.
	setMountPath := func(p string) {
		t.Helper()
		if err := s.Store.Update(ctx, func(tx store.Tx) error {
			r, err := s.load(ctx, tx, "p1", ws.WorkspaceId)
			if err != nil {
				return err
			}
			r.ws.Spec.Volume.MountPath = p
			return s.save(ctx, tx, r)
		}); err != nil {
			t.Fatal(err)
		}
	}
	setMountPath("/run/data")
	if _, err := Start(ctx, s, write("start at /run", newWS), ws.WorkspaceId, identity); connect.CodeOf(err) != connect.CodeFailedPrecondition ||
		!strings.Contains(err.Error(), "/run/data") || !strings.Contains(err.Error(), "kibotos ws volume") {
		t.Errorf("start with a volume at /run/data: %v, want failed_precondition saying how to move it", err)
	}
	setMountPath("/srv/data")
	// A second workspace cannot bind it; after a release it can, and
	// deleting that workspace keeps it.
	bound := &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: volID}
	_, err = Create(ctx, s, write("create2", newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 * MiB}, Volume: bound}, nil, nil, identity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || testutil.ErrorDetail(err).GetObservedWorkspace().GetWorkspaceId() != ws.WorkspaceId {
		t.Errorf("second binding: %v", err)
	}
	if _, err := rebind(ws, &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: volID, MountPath: "/srv/data", DeleteWithWorkspace: b.DeleteWithWorkspace}); err != nil {
		t.Errorf("the same binding again: %v", err)
	}
	// A path no guest can mount at is refused when the binding names it,
	// not at the next start.
	for _, p := range []string{"/a\x00b", "/" + strings.Repeat("x", 256), "/tmp/data"} {
		if _, err := rebind(ws, &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: volID, MountPath: p, DeleteWithWorkspace: b.DeleteWithWorkspace}); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("binding at %.40q: %v; want invalid_argument", p, err)
		}
	}
	released, err := rebind(ws, none)
	if err != nil || released.Spec.BindingRevision != 2 || released.PersistentPaths != nil {
		t.Fatalf("release: %v, %v", released, err)
	}
	other, err := Create(ctx, s, write("create3", newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 * MiB}, Volume: bound}, nil, nil, identity)
	if err != nil || other.Spec.Volume.GetDeleteWithWorkspace() || other.Spec.Volume.MountPath != DefaultMountPath {
		t.Fatalf("bind after release: %v, %v", other.GetSpec().GetVolume(), err)
	}
	report(t, s, ctx, other.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	if _, err := Stop(ctx, s, write("stop2", newWS), other.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	report(t, s, ctx, other.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_STOPPED, nil)
	if _, err := Delete(ctx, s, write("delete", newWS), other.WorkspaceId, identity); err != nil {
		t.Fatal(err)
	}
	// A stopped workspace being deleted holds no execution.
	if v, _ := s.Volumes.Get(ctx, volID); v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		t.Errorf("volume of a stopped workspace being deleted: %v", v.State)
	}
	report(t, s, ctx, other.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_DELETED, nil)
	if v, _ := s.Volumes.Get(ctx, volID); v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.BoundWorkspaceId != "" {
		t.Errorf("kept volume: %v", v)
	}

	// LOST: starting a workspace bound to it is VOLUME_LOST.
	ws, err = rebind(released, bound)
	if err != nil {
		t.Fatal(err)
	}
	// h1 is the only host of the pool: it need not be named.
	loss, err := s.Volumes.DeclarePoolLost(ctx, "default", "")
	if err != nil || loss.HostID != "h1" || !slices.Equal(loss.Lost, []string{volID}) {
		t.Fatalf("DeclarePoolLost: %+v, %v", loss, err)
	}
	if a := volumeAssignment(t, s, ctx, volID); a != nil {
		t.Errorf("a LOST volume is assigned: %v", a)
	}
	_, err = Start(ctx, s, write("start", newWS), ws.WorkspaceId, identity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || testutil.ErrorDetail(err).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_VOLUME_LOST {
		t.Errorf("start bound to a LOST volume: %v", err)
	}
	if _, err := s.Volumes.DeclarePoolLost(ctx, "nowhere", ""); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("an unknown pool: %v", err)
	}
}

// TestPoolLostOnOneHost: hosts ha and hb each have a pool "default", as
// every host has unless told otherwise. Declaring ha's lost makes LOST only
// the Volumes ha holds (a DELETING one DELETED); hb's keep their state and
// their assignments. Without a host, or with one the pool is not on, the
// declaration is refused and changes nothing.
func TestPoolLostOnOneHost(t *testing.T) {
	s, ctx := newService(t)
	s.Volumes = &volumes.Service{Store: s.Store, Pages: s.Pages, DefaultPool: "default", InUse: InUse, Changes: changes.NewBroker()}
	register := func(host string, pools ...*hostv1.StoragePool) {
		t.Helper()
		if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: host, Capacity: &hostv1.HostCapacity{
			CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}, StoragePools: pools}); err != nil {
			t.Fatal(err)
		}
	}
	defaultPool := &hostv1.StoragePool{Name: "default", DefaultVolumeBytes: 256 * MiB}
	register("ha", defaultPool)
	register("hb", defaultPool)
	drain := func(host string, drained bool) {
		t.Helper()
		if _, err := s.DrainHost(ctx, host, drained); err != nil {
			t.Fatal(err)
		}
	}
	// Two Volumes on each host, created and reported HEALTHY by it; the
	// second of each is then being deleted. A Volume goes to the first
	// host that takes new ones: ha, or hb while ha is drained.
	holder := map[string]string{}
	var onA, onB []string
	for _, host := range []string{"ha", "hb"} {
		drain("ha", host != "ha")
		for range 2 {
			v, err := volumes.Create(ctx, s.Volumes, write("create", newVol), &ctrlv1.VolumeSpec{}, nil, nil, volumeIdentity)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Report(ctx, host, nil, []*hostv1.VolumeReport{healthy(v.VolumeId, 256*MiB)}); err != nil {
				t.Fatal(err)
			}
			holder[v.VolumeId] = host
			if host == "ha" {
				onA = append(onA, v.VolumeId)
			} else {
				onB = append(onB, v.VolumeId)
			}
		}
	}
	drain("ha", false)
	for _, id := range []string{onA[1], onB[1]} {
		if _, err := volumes.Delete(ctx, s.Volumes, write("delete", newVol), id, volumeIdentity); err != nil {
			t.Fatal(err)
		}
	}
	assigned := func(host, id string) bool {
		t.Helper()
		as, err := s.Assignments(ctx, host)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(as.Volumes, func(a *hostv1.VolumeAssignment) bool { return a.VolumeId == id })
	}
	snapshot := func() map[string]*ctrlv1.Volume {
		t.Helper()
		out := map[string]*ctrlv1.Volume{}
		for id, host := range holder {
			v, err := s.Volumes.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if !assigned(host, id) {
				t.Errorf("volume %s (%v) is not assigned to %s", id, v.State, host)
			}
			out[id] = v
		}
		return out
	}
	before := snapshot()
	if v := before[onA[0]]; v.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.Observation.GetCondition() != ctrlv1.VolumeCondition_VOLUME_CONDITION_HEALTHY {
		t.Fatalf("volume on ha before: %v", v)
	}
	if v := before[onB[1]]; v.State != ctrlv1.VolumeState_VOLUME_STATE_DELETING {
		t.Fatalf("volume being deleted on hb before: %v", v)
	}
	unchanged := func(what string) {
		t.Helper()
		after := snapshot()
		for id, v := range before {
			if !proto.Equal(after[id], v) {
				t.Errorf("%s changed volume %s on %s: %v, was %v", what, id, holder[id], after[id].State, v.State)
			}
		}
	}

	// Refused, changing nothing: no host where two serve the pool (the
	// error names them and the flag), a host it is not on, a malformed
	// host.
	_, err := s.Volumes.DeclarePoolLost(ctx, "default", "")
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "ha, hb") || !strings.Contains(err.Error(), "--host") {
		t.Errorf("no host with two hosts: %v; want invalid_argument naming ha, hb and --host", err)
	}
	unchanged("a declaration without a host")
	if _, err := s.Volumes.DeclarePoolLost(ctx, "default", "h1"); connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "ha, hb") {
		t.Errorf("a host without the pool: %v; want not_found naming ha, hb", err)
	}
	if _, err := s.Volumes.DeclarePoolLost(ctx, "default", "Not A Host"); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a malformed host: %v; want invalid_argument", err)
	}
	unchanged("a refused declaration")

	// ha's pool is gone: only ha's Volumes change.
	loss, err := s.Volumes.DeclarePoolLost(ctx, "default", "ha")
	if err != nil || loss.HostID != "ha" || !slices.Equal(loss.Lost, onA[:1]) {
		t.Fatalf("DeclarePoolLost on ha: %+v, %v; want %v lost", loss, err, onA[:1])
	}
	if v, _ := s.Volumes.Get(ctx, onA[0]); v.State != ctrlv1.VolumeState_VOLUME_STATE_LOST || assigned("ha", onA[0]) {
		t.Errorf("ha's volume: %v, assigned %v; want LOST and unassigned", v.State, assigned("ha", onA[0]))
	}
	if v, _ := s.Volumes.Get(ctx, onA[1]); v.State != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
		t.Errorf("ha's volume being deleted: %v; want DELETED", v.State)
	}
	for _, id := range onA {
		delete(holder, id)
		delete(before, id)
	}
	unchanged("declaring ha's pool lost")

	// Again: harmless, even once ha registers without the pool; and an
	// empty host still does not mean hb.
	register("ha")
	for _, host := range []string{"ha", ""} {
		loss, err := s.Volumes.DeclarePoolLost(ctx, "default", host)
		if host == "" {
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("no host after ha's pool was declared lost: %+v, %v; want invalid_argument", loss, err)
			}
			continue
		}
		if err != nil || loss.HostID != "ha" || len(loss.Lost) != 0 {
			t.Errorf("declaring ha's pool lost again: %+v, %v", loss, err)
		}
	}
	unchanged("declaring ha's pool lost again")
}

// TestNewVolumeNeverCreated: a workspace deleted before its launch made
// its NEW volume deletes the volume whatever the binding says, also when
// the host finishes creating it while the deletion runs.
func TestNewVolumeNeverCreated(t *testing.T) {
	s, ctx := newVolumeService(t)
	keep := false
	for _, createdMeanwhile := range []bool{false, true} {
		ws, err := Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{
			Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 * MiB},
			Volume:    &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, DeleteWithWorkspace: &keep}}, nil, nil, identity)
		if err != nil {
			t.Fatal(err)
		}
		volID := ws.Spec.Volume.VolumeId
		if _, err := Delete(ctx, s, write("delete", newWS), ws.WorkspaceId, identity); err != nil {
			t.Fatal(err)
		}
		if createdMeanwhile {
			volumeReport(t, s, ctx, healthy(volID, 512*MiB))
		}
		report(t, s, ctx, ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_DELETED, nil)
		if v, _ := s.Volumes.Get(ctx, volID); v.State != ctrlv1.VolumeState_VOLUME_STATE_DELETING {
			t.Errorf("NEW volume uncreated when its workspace's deletion began (created meanwhile: %v): %v", createdMeanwhile, v)
		}
	}
}

// TestVolumeHolderAndStates: a volume is bound only when AVAILABLE, a
// workspace bound to it runs on the host that holds it, and a growth
// made online but cut short by a stop holds RESIZING.
func TestVolumeHolderAndStates(t *testing.T) {
	s, ctx := newVolumeService(t)
	// h3 also has a pool named "default" (a directory of its own) and the
	// most memory free.
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h3", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: 16 * gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib},
		StoragePools: []*hostv1.StoragePool{{Name: "default", DefaultVolumeBytes: 64 * MiB}}}); err != nil {
		t.Fatal(err)
	}
	v, err := volumes.Create(ctx, s.Volumes, write("create", newVol), &ctrlv1.VolumeSpec{StoragePool: "fast"}, nil, nil, volumeIdentity)
	if err != nil {
		t.Fatal(err)
	}
	bound := &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: v.VolumeId}
	spec := &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 * MiB}, Volume: bound}
	if _, err := Create(ctx, s, write("early", newWS), spec, nil, nil, identity); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("binding a CREATING volume: %v", err)
	}
	volumeReport(t, s, ctx, healthy(v.VolumeId, 128*MiB))
	ws, err := Create(ctx, s, write("bound", newWS), spec, nil, nil, identity)
	if err != nil {
		t.Fatal(err)
	}
	as, _ := s.Assignments(ctx, "h1")
	if len(as.Assignments) != 1 || as.Assignments[0].WorkspaceId != ws.WorkspaceId {
		t.Fatalf("the workspace is not on the volume's host: %v", as)
	}
	ws = report(t, s, ctx, ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)

	// "fast" grows online: the resize is admitted while ATTACHED.
	got, err := volumes.Resize(ctx, s.Volumes, write("grow", newVol), v.VolumeId, 256*MiB, volumeIdentity)
	if err != nil || got.State != ctrlv1.VolumeState_VOLUME_STATE_ATTACHED || got.Spec.CapacityBytes != 128*MiB {
		t.Fatalf("online resize: %v, %v", got, err)
	}
	// Stopped before the host grew it: RESIZING, and nothing starts.
	if _, err := Stop(ctx, s, write("stop", newWS), ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	ws = report(t, s, ctx, ws.WorkspaceId, hostv1.ObservedState_OBSERVED_STATE_STOPPED, nil)
	if got, _ := s.Volumes.Get(ctx, v.VolumeId); got.State != ctrlv1.VolumeState_VOLUME_STATE_RESIZING {
		t.Errorf("a pending growth after the stop: %v", got.State)
	}
	if _, err := Start(ctx, s, write("start", newWS), ws.WorkspaceId, identity); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("start while RESIZING: %v", err)
	}
	if got := volumeReport(t, s, ctx, healthy(v.VolumeId, 256*MiB)); got.State != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || got.Spec.CapacityBytes != 256*MiB {
		t.Errorf("grown: %v", got)
	}
	if _, err := Start(ctx, s, write("start2", newWS), ws.WorkspaceId, identity); err != nil {
		t.Errorf("start once grown: %v", err)
	}
}

// TestVolumesAndLayersShareAFilesystem: on a host whose storage pool is on
// the filesystem of its writable layers, Volumes and layers draw on one
// space: neither is promised what the other was, as both are sparse
// images that fail their guests when the filesystem fills.
func TestVolumesAndLayersShareAFilesystem(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			s, ctx := newService(t)
			s.Volumes = &volumes.Service{Store: s.Store, Pages: s.Pages, DefaultPool: "default", InUse: InUse, Changes: changes.NewBroker()}
			if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
				CpuMillis: 4000, MemoryBytes: 8 * gib, LayerBytes: gib, DefaultLayerBytes: 64 * MiB},
				StoragePools: []*hostv1.StoragePool{{Name: "default", DefaultVolumeBytes: 256 * MiB, CapacityBytes: proto.Uint64(gib),
					SharesLayerFilesystem: shared}}}); err != nil {
				t.Fatal(err)
			}
			newVolume := func(bytes uint64) error {
				_, err := volumes.Create(ctx, s.Volumes, write(fmt.Sprint("volume", bytes), newVol), &ctrlv1.VolumeSpec{CapacityBytes: bytes}, nil, nil, volumeIdentity)
				return err
			}
			newWorkspace := func(layer uint64) error {
				_, err := Create(ctx, s, write(fmt.Sprint("ws", layer), newWS), &ctrlv1.WorkspaceCreateSpec{
					Resources: &ctrlv1.ResourceRequest{MemoryBytes: 256 * MiB, WritableLayerBytes: layer}}, nil, nil, identity)
				return err
			}
			if err := newVolume(600 * MiB); err != nil {
				t.Fatal(err)
			}
			// 600 MiB of Volume and 600 of layer: more than the 1 GiB free.
			if err := newWorkspace(600 * MiB); shared != (connect.CodeOf(err) == connect.CodeResourceExhausted) {
				t.Errorf("a 600 MiB layer beside a 600 MiB Volume: %v", err)
			}
			if err := newWorkspace(300 * MiB); err != nil {
				t.Fatalf("a 300 MiB layer beside a 600 MiB Volume: %v", err)
			}
			// 600 + 300 (+ 600 unshared) + 200: the Volume is refused when shared.
			if err := newVolume(200 * MiB); shared != (connect.CodeOf(err) == connect.CodeResourceExhausted) {
				t.Errorf("a 200 MiB Volume beside 900 MiB: %v", err)
			}
			if err := newVolume(100 * MiB); err != nil {
				t.Errorf("a 100 MiB Volume that fits: %v", err)
			}
		})
	}
}

// TestFullPoolGivesNothing: a pool whose host found its filesystem full
// (capacity zero, not unknown) takes no Volume.
func TestFullPoolGivesNothing(t *testing.T) {
	s, ctx := newService(t)
	s.Volumes = &volumes.Service{Store: s.Store, Pages: s.Pages, DefaultPool: "default", InUse: InUse, Changes: changes.NewBroker()}
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: 8 * gib, LayerBytes: gib, DefaultLayerBytes: 64 * MiB},
		StoragePools: []*hostv1.StoragePool{{Name: "default", DefaultVolumeBytes: 256 * MiB, CapacityBytes: proto.Uint64(0)}}}); err != nil {
		t.Fatal(err)
	}
	_, err := volumes.Create(ctx, s.Volumes, write("volume", newVol), &ctrlv1.VolumeSpec{CapacityBytes: 100 << 30}, nil, nil, volumeIdentity)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a 100 GiB Volume in a full pool: %v, want resource_exhausted", err)
	}
}

// TestPoolRoomIsEachHosts: each host's pool of a name has its own room:
// the Volumes one host holds do not take another's.
func TestPoolRoomIsEachHosts(t *testing.T) {
	s, ctx := newService(t)
	s.Volumes = &volumes.Service{Store: s.Store, Pages: s.Pages, DefaultPool: "default", InUse: InUse, Changes: changes.NewBroker()}
	for _, host := range []string{"ha", "hb"} {
		if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: host, Capacity: &hostv1.HostCapacity{
			CpuMillis: 4000, MemoryBytes: 8 * gib, LayerBytes: gib, DefaultLayerBytes: 64 * MiB},
			StoragePools: []*hostv1.StoragePool{{Name: "default", DefaultVolumeBytes: 256 * MiB, CapacityBytes: proto.Uint64(gib)}}}); err != nil {
			t.Fatal(err)
		}
	}
	create := func() error {
		_, err := volumes.Create(ctx, s.Volumes, write("volume", newVol), &ctrlv1.VolumeSpec{CapacityBytes: 700 * MiB}, nil, nil, volumeIdentity)
		return err
	}
	if _, err := s.DrainHost(ctx, "hb", true); err != nil {
		t.Fatal(err)
	}
	if err := create(); err != nil {
		t.Fatal(err)
	}
	if err := create(); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a second 700 MiB Volume in ha's 1 GiB pool: %v, want resource_exhausted", err)
	}
	for host, drained := range map[string]bool{"ha": true, "hb": false} {
		if _, err := s.DrainHost(ctx, host, drained); err != nil {
			t.Fatal(err)
		}
	}
	if err := create(); err != nil {
		t.Errorf("a 700 MiB Volume in hb's empty 1 GiB pool: %v", err)
	}
}

// TestVolumeCreatedOnAHostThatTakesIt: a new Volume goes to a host of its
// pool that takes new Volumes, never to a drained or LOST one, where it
// would wait CREATING; with none, the create is refused.
func TestVolumeCreatedOnAHostThatTakesIt(t *testing.T) {
	s, ctx := newVolumeService(t)
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h3", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib},
		StoragePools: []*hostv1.StoragePool{{Name: "default", DefaultVolumeBytes: 256 * MiB}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DrainHost(ctx, "h1", true); err != nil {
		t.Fatal(err)
	}
	v, err := volumes.Create(ctx, s.Volumes, write("create", newVol), &ctrlv1.VolumeSpec{}, nil, nil, volumeIdentity)
	if err != nil {
		t.Fatal(err)
	}
	as, err := s.Assignments(ctx, "h3")
	if err != nil || !slices.ContainsFunc(as.Volumes, func(a *hostv1.VolumeAssignment) bool { return a.VolumeId == v.VolumeId }) {
		t.Errorf("the Volume created while h1 is drained is not h3's: %v, %v", as.GetVolumes(), err)
	}
	if _, err := s.DrainHost(ctx, "h3", true); err != nil {
		t.Fatal(err)
	}
	_, err = volumes.Create(ctx, s.Volumes, write("create", newVol), &ctrlv1.VolumeSpec{}, nil, nil, volumeIdentity)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "LOST or drained") {
		t.Errorf("a Volume with every host of its pool drained: %v", err)
	}
}

// TestBindingAVolumeOfADrainedHost: a workspace bound to a Volume whose
// host is drained is refused for that, not for capabilities it lacks.
func TestBindingAVolumeOfADrainedHost(t *testing.T) {
	s, ctx := newVolumeService(t)
	v, err := volumes.Create(ctx, s.Volumes, write("create", newVol), &ctrlv1.VolumeSpec{}, nil, nil, volumeIdentity)
	if err != nil {
		t.Fatal(err)
	}
	volumeReport(t, s, ctx, healthy(v.VolumeId, 256*MiB))
	if _, err := s.DrainHost(ctx, "h1", true); err != nil {
		t.Fatal(err)
	}
	_, err = Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20},
		Volume: &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: v.VolumeId, MountPath: "/data"}}, nil, nil, identity)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "drained or not reporting") {
		t.Errorf("binding a volume of a drained host: %v", err)
	}
}
