package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// volumeFake serves the VolumeService methods the tests call and records
// the requests. Tests use it for what the real server does not produce on
// demand: Volumes that FAILED, did not grow, are LOST or DAMAGED, a wait
// that times out, and a storage pool declared lost (the package's
// deployment has one pool, which the other tests use).
type volumeFake struct {
	ctrlv1connect.UnimplementedVolumeServiceHandler
	adminv1connect.UnimplementedAdminServiceHandler

	recorder

	vol   *ctrlv1.Volume                         // returned by the writes
	polls []*ctrlv1.Volume                       // returned by GetVolume in turn, the last one again; not_found when empty
	pages map[string]*ctrlv1.ListVolumesResponse // by page token
}

func (f *volumeFake) CreateVolume(_ context.Context, r *connect.Request[ctrlv1.CreateVolumeRequest]) (*connect.Response[ctrlv1.CreateVolumeResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.CreateVolumeResponse{Volume: f.vol}), nil
}

func (f *volumeFake) GetVolume(_ context.Context, r *connect.Request[ctrlv1.GetVolumeRequest]) (*connect.Response[ctrlv1.GetVolumeResponse], error) {
	f.record(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.polls) == 0 {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("volume "+r.Msg.GetVolumeId()+" not found"))
	}
	v := f.polls[0]
	if len(f.polls) > 1 {
		f.polls = f.polls[1:]
	}
	return connect.NewResponse(&ctrlv1.GetVolumeResponse{Volume: v}), nil
}

func (f *volumeFake) ListVolumes(_ context.Context, r *connect.Request[ctrlv1.ListVolumesRequest]) (*connect.Response[ctrlv1.ListVolumesResponse], error) {
	f.record(r)
	return connect.NewResponse(f.pages[r.Msg.GetPageToken()]), nil
}

func (f *volumeFake) ResizeVolume(_ context.Context, r *connect.Request[ctrlv1.ResizeVolumeRequest]) (*connect.Response[ctrlv1.ResizeVolumeResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.ResizeVolumeResponse{Volume: f.vol}), nil
}

func (f *volumeFake) ListStoragePools(_ context.Context, r *connect.Request[adminv1.ListStoragePoolsRequest]) (*connect.Response[adminv1.ListStoragePoolsResponse], error) {
	f.record(r)
	return connect.NewResponse(&adminv1.ListStoragePoolsResponse{StoragePools: []*adminv1.StoragePool{
		{Name: "fast", HostIds: []string{"host_1", "host_2"}, DefaultVolumeBytes: 10 << 30, Default: true},
		{Name: "slow", DefaultVolumeBytes: 100 << 30},
	}}), nil
}

func (f *volumeFake) DeclareStoragePoolLost(_ context.Context, r *connect.Request[adminv1.DeclareStoragePoolLostRequest]) (*connect.Response[adminv1.DeclareStoragePoolLostResponse], error) {
	f.record(r)
	return connect.NewResponse(&adminv1.DeclareStoragePoolLostResponse{LostVolumeIds: []string{"vol_a", "vol_b"}, HostId: "host_2"}), nil
}

func newVolumeEnv(t *testing.T) (*env, *volumeFake) {
	t.Helper()
	f := &volumeFake{vol: testVolume(ctrlv1.VolumeState_VOLUME_STATE_CREATING)}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewVolumeServiceHandler(f))
	mux.Handle(adminv1connect.NewAdminServiceHandler(f))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	home := cleanHome(t)
	return &env{addr: srv.URL, home: home, token: "tok"}, f
}

func testVolume(state ctrlv1.VolumeState) *ctrlv1.Volume {
	return &ctrlv1.Volume{
		VolumeId:       "vol_1",
		Spec:           &ctrlv1.VolumeSpec{CapacityBytes: 10 << 30, StoragePool: "fast"},
		State:          state,
		CreatedAt:      created,
		Labels:         map[string]string{"team": "ml"},
		LabelsRevision: 2,
	}
}

// volume reads a volume from the server.
func (e *env) volume(t *testing.T, id string) *ctrlv1.Volume {
	t.Helper()
	cl := ctrlv1connect.NewVolumeServiceClient(http.DefaultClient, e.addr, connect.WithInterceptors(bearer.Token(e.token)))
	resp, err := cl.GetVolume(t.Context(), connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetVolume()
}

// createVolume runs `volume create -o json args...` and returns the Volume
// it printed.
func (e *env) createVolume(t *testing.T, args ...string) *ctrlv1.Volume {
	t.Helper()
	var resp ctrlv1.CreateVolumeResponse
	e.callJSON(t, &resp, append([]string{"volume", "create", "-o", "json"}, args...)...)
	return resp.GetVolume()
}

func TestVolumeCreateSendsSpec(t *testing.T) {
	e := newUpEnv(t)
	stdout, _ := e.call(t, "", "volume", "create", "--size", "64Mi", "--pool", "default",
		"--label", "team=ml", "--annotation", "note=x", "--command-id", "c1")
	lines := fields(stdout)
	if len(lines) != 2 || lines[0] != "ID STATE CAPACITY POOL WORKSPACE USED CONDITION LABELS AGE" {
		t.Fatalf("table:\n%s", stdout)
	}
	row := strings.Fields(lines[1])
	v := e.volume(t, row[0])
	if want := v.GetVolumeId() + " CREATING 64Mi default - - - team=ml " + age(v.GetCreatedAt()); lines[1] != want {
		t.Errorf("row = %q, want %q", lines[1], want)
	}
	if v.GetSpec().GetCapacityBytes() != 64<<20 || v.GetSpec().GetStoragePool() != "default" || v.GetAnnotations()["note"] != "x" {
		t.Errorf("stored = %v", v)
	}
	// The command ID is sent: the same command again is the same Volume.
	if again := e.createVolume(t, "--size", "64Mi", "--pool", "default", "--label", "team=ml", "--annotation", "note=x", "--command-id", "c1"); again.GetVolumeId() != v.GetVolumeId() {
		t.Errorf("the command repeated made %s, want %s", again.GetVolumeId(), v.GetVolumeId())
	}

	// Without --size and --pool the server picks both; a command ID is made up.
	other := e.createVolume(t)
	if other.GetVolumeId() == v.GetVolumeId() || other.GetSpec().GetCapacityBytes() == 0 || other.GetSpec().GetStoragePool() != "default" {
		t.Errorf("created without flags: %v", other)
	}
}

func TestVolumeSizeMustBeWholeMiB(t *testing.T) {
	e := newEnv(t)
	for _, args := range [][]string{
		{"volume", "create", "--size", "1G"},
		{"volume", "create", "--size", "1500Ki"},
		{"volume", "create", "--size", "1048577"},
		{"volume", "create", "--size", "10GB"},
		{"volume", "resize", "vol_1", "2G"},
		{"volume", "resize", "vol_1", "big"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			_, _, err := e.run(t, "", append(args, "--addr", e.addr, "--token", e.token)...)
			// The flag, or the argument, by the name it has.
			name := map[string]string{"create": "--size", "resize": "SIZE "}[args[1]]
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("err = %v, want a refusal of %s", err, name)
			}
			if calls, _, _ := e.got(); len(calls) != 0 {
				t.Errorf("calls = %v, want none", calls)
			}
		})
	}
	for in, want := range map[string]uint64{"0": 0, "1Mi": 1 << 20, "1048576": 1 << 20, "3Gi": 3 << 30, "2048Ki": 2 << 20, "1GiB": 1 << 30} {
		if got, err := parseMiB("--size", in); err != nil || got != want {
			t.Errorf("parseMiB(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestVolumeListFollowsPages(t *testing.T) {
	e, f := newVolumeEnv(t)
	a := testVolume(ctrlv1.VolumeState_VOLUME_STATE_ATTACHED)
	a.BoundWorkspaceId = "ws_1"
	a.Observation = &ctrlv1.VolumeObservation{Condition: ctrlv1.VolumeCondition_VOLUME_CONDITION_HEALTHY, UsedBytes: 1536 << 20}
	b := testVolume(ctrlv1.VolumeState_VOLUME_STATE_FAILED)
	b.VolumeId, b.Failure = "vol_2", &ctrlv1.VolumeFailure{Reason: ctrlv1.FailureReason_FAILURE_REASON_INTERNAL}
	c := testVolume(ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE)
	c.VolumeId = "vol_3"
	c.Failure = &ctrlv1.VolumeFailure{Stage: ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME}
	c.Observation = &ctrlv1.VolumeObservation{Condition: ctrlv1.VolumeCondition_VOLUME_CONDITION_DAMAGED}
	f.pages = map[string]*ctrlv1.ListVolumesResponse{
		"":   {Volumes: []*ctrlv1.Volume{a, b}, NextPageToken: "p2"},
		"p2": {Volumes: []*ctrlv1.Volume{c}},
	}
	stdout, _ := e.call(t, "", "volume", "list", "--all", "--selector", "team=ml")
	want := []string{
		"ID STATE CAPACITY POOL WORKSPACE USED CONDITION LABELS AGE",
		"vol_1 ATTACHED 10Gi fast ws_1 1.5Gi HEALTHY team=ml " + age(a.GetCreatedAt()),
		"vol_2 FAILED(INTERNAL) 10Gi fast - - - team=ml " + age(b.GetCreatedAt()),
		"vol_3 AVAILABLE(RESIZE_FAILED) 10Gi fast - 0 DAMAGED team=ml " + age(c.GetCreatedAt()),
	}
	wantFields(t, "table", stdout, want)
	calls, reqs := f.got()
	if strings.Join(calls, ",") != "ListVolumes,ListVolumes" {
		t.Fatalf("calls = %v", calls)
	}
	if r := reqs[1].(*ctrlv1.ListVolumesRequest); r.GetPageToken() != "p2" || r.GetLabelSelector()["team"] != "ml" {
		t.Errorf("second request = %v", r)
	}
}

func TestVolumeResizeWaits(t *testing.T) {
	e := newUpEnv(t)
	v := e.createVolume(t, "--size", "64Mi", "--wait")
	stdout, stderr := e.call(t, "", "volume", "resize", v.GetVolumeId(), "128Mi", "--wait", "--command-id", "r1")
	if !strings.Contains(stdout, "RESIZING") || !strings.Contains(stderr, "RESIZING → AVAILABLE in ") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	if got := e.volume(t, v.GetVolumeId()); got.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || got.GetSpec().GetCapacityBytes() != 128<<20 {
		t.Errorf("after resize --wait: %v", got)
	}
}

func TestVolumeWaitReportsFailures(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		vol   ctrlv1.VolumeState
		polls func() []*ctrlv1.Volume
		want  []string
	}{
		{
			name: "resize",
			args: []string{"resize", "vol_1", "20Gi"},
			vol:  ctrlv1.VolumeState_VOLUME_STATE_RESIZING,
			polls: func() []*ctrlv1.Volume {
				return []*ctrlv1.Volume{failedVolume(ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE, ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED,
					ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME, "pool full")}
			},
			want: []string{"vol_1 did not grow", "RESOURCE_EXHAUSTED", "pool full", "AVAILABLE at 10Gi"},
		},
		{
			name: "create",
			args: []string{"create"},
			vol:  ctrlv1.VolumeState_VOLUME_STATE_CREATING,
			polls: func() []*ctrlv1.Volume {
				return []*ctrlv1.Volume{testVolume(ctrlv1.VolumeState_VOLUME_STATE_CREATING), failedVolume(ctrlv1.VolumeState_VOLUME_STATE_FAILED,
					ctrlv1.FailureReason_FAILURE_REASON_INTERNAL, ctrlv1.FailureStage_FAILURE_STAGE_CREATING_VOLUME, "mkfs failed")}
			},
			want: []string{"vol_1 FAILED", "INTERNAL", "CREATING_VOLUME", "mkfs failed"},
		},
		{
			name:  "create lost",
			args:  []string{"create"},
			vol:   ctrlv1.VolumeState_VOLUME_STATE_CREATING,
			polls: func() []*ctrlv1.Volume { return []*ctrlv1.Volume{testVolume(ctrlv1.VolumeState_VOLUME_STATE_LOST)} },
			want:  []string{"vol_1 is LOST and will not become AVAILABLE"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f := newVolumeEnv(t)
			f.vol, f.polls = testVolume(tc.vol), tc.polls()
			args := append([]string{"volume"}, tc.args...)
			_, _, err := e.run(t, "", append(args, "--wait", "--addr", e.addr, "--token", "t")...)
			if err == nil {
				t.Fatal("the wait succeeded")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// failedVolume is testVolume in state with the failure reason, stage and
// message.
func failedVolume(state ctrlv1.VolumeState, reason ctrlv1.FailureReason, stage ctrlv1.FailureStage, message string) *ctrlv1.Volume {
	v := testVolume(state)
	v.Failure = &ctrlv1.VolumeFailure{Reason: reason, Stage: stage, Message: message}
	return v
}

func TestVolumeWaitTimesOut(t *testing.T) {
	e, f := newVolumeEnv(t)
	f.polls = []*ctrlv1.Volume{f.vol}
	_, _, err := e.run(t, "", "volume", "create", "--wait", "--timeout", "300ms", "--addr", e.addr, "--token", "t")
	if err == nil || !strings.Contains(err.Error(), "timed out after 300ms waiting for volume vol_1 to become AVAILABLE; it is CREATING") {
		t.Fatalf("err = %v, want a timeout", err)
	}
}

func TestVolumeDelete(t *testing.T) {
	e := newUpEnv(t)
	v := e.createVolume(t, "--size", "64Mi", "--wait")
	stdout, stderr := e.call(t, "", "volume", "delete", v.GetVolumeId(), "--wait")
	if !strings.Contains(stdout, "DELETING") || !strings.Contains(stderr, "DELETING → DELETED") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	if got := e.volume(t, v.GetVolumeId()).GetState(); got != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
		t.Errorf("after delete --wait: %v", got)
	}
}

func TestVolumeLabelReadsRevision(t *testing.T) {
	e := newUpEnv(t)
	v := e.createVolume(t, "--size", "64Mi", "--label", "team=ml")
	e.call(t, "", "volume", "label", v.GetVolumeId(), "team=infra")
	got := e.volume(t, v.GetVolumeId())
	if got.GetLabels()["team"] != "infra" || got.GetLabelsRevision() <= v.GetLabelsRevision() {
		t.Errorf("after label: %v", got)
	}
}

func TestWorkspaceCreateVolume(t *testing.T) {
	const (
		none  = ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE
		fresh = ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW
		bound = ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND
	)
	e := newPlacedEnv(t)
	for _, tc := range []struct {
		args []string
		want *ctrlv1.WorkspaceVolumeBinding
	}{
		{[]string{"--volume", "NEW:/work"}, &ctrlv1.WorkspaceVolumeBinding{Mode: fresh, MountPath: "/work"}},
		{[]string{"--volume", "new"}, &ctrlv1.WorkspaceVolumeBinding{Mode: fresh}},
		{[]string{"--volume", "NEW", "--keep-volume"}, &ctrlv1.WorkspaceVolumeBinding{Mode: fresh, DeleteWithWorkspace: proto.Bool(false)}},
		{[]string{"--volume", "vol_x"}, &ctrlv1.WorkspaceVolumeBinding{Mode: bound, VolumeId: "vol_x"}},
		{[]string{"--volume", "vol_x:/srv/a:b", "--delete-volume"}, &ctrlv1.WorkspaceVolumeBinding{Mode: bound, VolumeId: "vol_x", MountPath: "/srv/a:b", DeleteWithWorkspace: proto.Bool(true)}},
		{[]string{"--volume", "none"}, &ctrlv1.WorkspaceVolumeBinding{Mode: none}},
		{nil, nil},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			// What the server answers (a volume it does not hold is
			// not_found) does not matter here: what the CLI sent does.
			e.run(t, "", append([]string{"ws", "create", "--addr", e.addr, "--token", e.token}, tc.args...)...)
			calls, _, reqs := e.got()
			if strings.Join(calls, ",") != "CreateWorkspace" {
				t.Fatalf("calls = %v", calls)
			}
			got := reqs[0].(*ctrlv1.CreateWorkspaceRequest).GetSpec().GetVolume()
			if !proto.Equal(got, tc.want) {
				t.Errorf("spec.volume = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWorkspaceVolume(t *testing.T) {
	e := newUpEnv(t)
	vol := e.createVolume(t, "--size", "64Mi", "--wait").GetVolumeId()
	ws := e.createWorkspace(t, append([]string{"--wait", "--volume", vol + ":/data", "--delete-volume"}, smallWorkspace...)...)
	id := ws.GetWorkspaceId()
	rev := e.workspace(t, id).GetSpec().GetBindingRevision()

	// ID alone shows the binding; ws get has it in its table.
	stdout, _ := e.call(t, "", "ws", "volume", id)
	for _, want := range []string{"MODE BOUND", "VOLUME " + vol, "MOUNT_PATH /data", "DELETE_WITH_WORKSPACE true", fmt.Sprint("BINDING_REVISION ", rev)} {
		if !strings.Contains(strings.Join(fields(stdout), "\n"), want) {
			t.Errorf("ws volume %s lacks %q:\n%s", id, want, stdout)
		}
	}
	stdout, _ = e.call(t, "", "ws", "get", id)
	if row := fields(stdout)[1]; !strings.Contains(row, " "+vol+":/data ") {
		t.Errorf("ws get row %q lacks the binding", row)
	}

	// A binding changes while the workspace is stopped, at the revision read.
	e.call(t, "", "ws", "stop", id, "--wait")
	e.call(t, "", "ws", "volume", id, "none")
	got := e.workspace(t, id).GetSpec()
	if got.GetVolume().GetMode() != ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE || got.GetBindingRevision() <= rev {
		t.Errorf("after ws volume none: %v", got)
	}

	other := e.createVolume(t, "--size", "64Mi", "--wait").GetVolumeId()
	stale := fmt.Sprint(rev)
	if _, _, err := e.run(t, "", "ws", "volume", id, other+":/work", "--expected-binding-revision", stale, "--addr", e.addr, "--token", e.token); err == nil {
		t.Error("a stale --expected-binding-revision succeeded")
	}
	stdout, _ = e.call(t, "", "ws", "volume", id, other+":/work", "--delete-with-workspace", "--expected-binding-revision", fmt.Sprint(got.GetBindingRevision()))
	want := &ctrlv1.WorkspaceVolumeBinding{
		Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: other, MountPath: "/work", DeleteWithWorkspace: proto.Bool(true),
	}
	if b := e.workspace(t, id).GetSpec().GetVolume(); !proto.Equal(b, want) {
		t.Errorf("binding = %v, want %v", b, want)
	}
	if !strings.Contains(stdout, other) || !strings.Contains(stdout, "/work") {
		t.Errorf("output lacks the new binding:\n%s", stdout)
	}
}

func TestVolumeBindingRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ws", "create", "--volume", ":/x"}, "want NEW[:PATH], VOLUME_ID[:PATH] or none"},
		{[]string{"ws", "create", "--volume", "vol_x:work"}, "not absolute"},
		{[]string{"ws", "create", "--volume", "vol_x:"}, "not absolute"},
		{[]string{"ws", "create", "--volume", "NEW:/a/../b/"}, "write /b"},
		{[]string{"ws", "create", "--volume", "none:/x"}, "none takes no PATH"},
		{[]string{"ws", "create", "--keep-volume"}, "need --volume"},
		{[]string{"ws", "create", "--volume", "none", "--delete-volume"}, "not none"},
		{[]string{"ws", "create", "--volume", "new", "--keep-volume", "--delete-volume"}, "keep-volume"},
		{[]string{"ws", "volume", "ws_1", "NEW"}, "only for `ws create`"},
		{[]string{"ws", "volume", "ws_1", "new:/x"}, "only for `ws create`"},
		{[]string{"ws", "volume", "ws_1", "vol_x:data"}, "not absolute"},
		{[]string{"ws", "volume", "ws_1", "none", "--delete-with-workspace"}, "not none"},
		{[]string{"ws", "volume", "ws_1", "--delete-with-workspace"}, "needs a binding"},
		{[]string{"ws", "volume", "ws_1", "vol_x", "vol_y"}, "accepts between 1 and 2"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := e.run(t, "", append(tc.args, "--addr", e.addr, "--token", e.token)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if calls, _, _ := e.got(); len(calls) != 0 {
				t.Errorf("calls = %v, want none", calls)
			}
		})
	}
}

func TestAdminPool(t *testing.T) {
	e, f := newVolumeEnv(t)
	stdout, stderr := e.call(t, "", "admin", "pool", "lost", "fast", "--host", "host_2")
	if stdout != "vol_a\nvol_b\n" {
		t.Errorf("stdout = %q, want the lost Volume IDs one a line", stdout)
	}
	if !strings.Contains(stderr, "fast on host host_2") || !strings.Contains(stderr, "2 Volume(s) became LOST") {
		t.Errorf("stderr = %q", stderr)
	}

	stdout, _ = e.call(t, "", "admin", "pool", "list")
	want := []string{
		"NAME DEFAULT PROFILE HOSTS",
		"fast true 10Gi host_1,host_2",
		"slow false 100Gi -",
	}
	wantFields(t, "table", stdout, want)

	calls, reqs := f.got()
	if strings.Join(calls, ",") != "DeclareStoragePoolLost,ListStoragePools" {
		t.Fatalf("calls = %v", calls)
	}
	if r := reqs[0].(*adminv1.DeclareStoragePoolLostRequest); r.GetStoragePool() != "fast" || r.GetHostId() != "host_2" {
		t.Errorf("request = %v", r)
	}
}
