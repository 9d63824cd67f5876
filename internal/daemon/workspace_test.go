package daemon_test

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// guestAgent is the kibotos-guest binary TestMain builds.
var guestAgent string

func TestMain(m *testing.M) { testutil.RunWithGuestAgent(m, &guestAgent) }

// deployment is one `kibotos up` run in this process, on the real runtime.
type deployment struct {
	t      *testing.T
	home   string
	url    string
	client ctrlv1connect.WorkspaceServiceClient
	cancel context.CancelFunc
	done   chan error
}

// up starts a deployment on home; stop it with d.stop.
func up(t *testing.T, home string) *deployment {
	t.Helper()
	return upWith(t, home, daemon.Options{})
}

// upWith starts a deployment on home with o's network, storage, guest
// health, metrics, desktop and tracing settings.
func upWith(t *testing.T, home string, o daemon.Options) *deployment {
	t.Helper()
	hosttest.RequireRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	d := &deployment{t: t, home: home, cancel: cancel, done: make(chan error, 1)}
	go func() {
		d.done <- daemon.Run(ctx, daemon.Options{Home: home, Listen: "127.0.0.1:0", Host: true,
			GuestAgent: cmp.Or(o.GuestAgent, guestAgent), Runtime: o.Runtime, Ready: func(a net.Addr) { ready <- a },
			UnsafeExemptRanges: o.UnsafeExemptRanges, DeploymentResolvers: o.DeploymentResolvers,
			StoragePools: o.StoragePools, VolumeBytes: o.VolumeBytes, MetricsTokenFile: o.MetricsTokenFile,
			GuestProbeInterval: o.GuestProbeInterval, GuestMemory: o.GuestMemory, ExposureDomain: o.ExposureDomain,
			DesktopCache: o.DesktopCache, InsecureRegistries: o.InsecureRegistries, RegistryCAFile: o.RegistryCAFile,
			OTLPEndpoint: o.OTLPEndpoint, WarmPool: o.WarmPool, Overcommit: o.Overcommit, GuestConnections: o.GuestConnections})
	}()
	select {
	case a := <-ready:
		d.url = "http://" + a.String()
	case err := <-d.done:
		t.Fatalf("kibotos up: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("kibotos up did not start")
	}
	token, err := os.ReadFile(filepath.Join(home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	d.client = ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, d.url,
		connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token)))))
	return d
}

// stop deletes every workspace left (so that a failing test leaves no
// container, mount or loop device behind) and stops the deployment.
func (d *deployment) stop() {
	ctx := context.Background()
	list, err := d.client.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{PageSize: 1000}))
	if err == nil {
		for _, ws := range list.Msg.Workspaces {
			d.client.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}))
		}
		for _, ws := range list.Msg.Workspaces {
			d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
		}
	}
	d.cancel()
	if err := <-d.done; err != nil {
		d.t.Errorf("kibotos up: %v", err)
	}
}

func cmd() *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: uuid.NewString()} }

const mib = 1 << 20

func (d *deployment) create(spec *ctrlv1.WorkspaceCreateSpec) *ctrlv1.Workspace {
	d.t.Helper()
	return mustUnary(d.t, d.client.CreateWorkspace, &ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: spec}).Workspace
}

func small() *ctrlv1.WorkspaceCreateSpec {
	return &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 500, MemoryBytes: 128 * mib, WritableLayerBytes: 64 * mib}}
}

// eventually reads a value every 50 ms until done holds of it and returns
// it. A read error, or timeout passing, fails the test with what it
// waited for and the last value read.
func eventually[T any](t *testing.T, timeout time.Duration, what string, read func() (T, error), done func(T) bool) T {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, err := read()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if done(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last: %v", what, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// unary runs one unary call of a Connect client and returns the message of
// its response.
func unary[Req, Resp any](ctx context.Context, method func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*Resp, error) {
	resp, err := method(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// mustUnary is unary that fails the test on an error.
func mustUnary[Req, Resp any](t testing.TB, method func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) *Resp {
	t.Helper()
	resp, err := unary(context.Background(), method, req)
	if err != nil {
		t.Fatalf("%T: %v", req, err)
	}
	return resp
}

// get reads a workspace.
func (d *deployment) get(id string) (*ctrlv1.Workspace, error) {
	resp, err := unary(context.Background(), d.client.GetWorkspace, &ctrlv1.GetWorkspaceRequest{WorkspaceId: id})
	return resp.GetWorkspace(), err
}

// awaitWorkspace polls a workspace until cond holds of it.
func (d *deployment) awaitWorkspace(id, what string, cond func(*ctrlv1.Workspace) bool) *ctrlv1.Workspace {
	d.t.Helper()
	return eventually(d.t, 60*time.Second, what, func() (*ctrlv1.Workspace, error) { return d.get(id) }, cond)
}

// await polls until the workspace reaches state, failing on FAILED.
func (d *deployment) await(id string, state ctrlv1.WorkspaceState) *ctrlv1.Workspace {
	d.t.Helper()
	ws := d.awaitWorkspace(id, fmt.Sprintf("workspace %s %v", id, state), func(ws *ctrlv1.Workspace) bool {
		return ws.State == state || ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
	})
	if ws.State != state {
		d.t.Fatalf("workspace %s is %v (failure %v), want %v", id, ws.State, ws.Failure, state)
	}
	return ws
}

// exec runs a command in the workspace's current execution through the
// runtime directly, by the runtime ID that serves it (a warm pool entry's
// for an execution bound to one).
func (d *deployment) exec(ws *ctrlv1.Workspace, args ...string) (string, error) {
	id := fmt.Sprintf("%s-%d", ws.WorkspaceId, ws.Generation)
	if rid, ok := d.poolEntry(id); ok {
		id = rid
	}
	out, err := d.driver().Exec(context.Background(), id, args...)
	return string(out), err
}

// driver is a runtime driver on the deployment's state, for observing.
func (d *deployment) driver() *oci.Driver {
	drv, err := oci.New(oci.Config{StateDir: filepath.Join(d.home, "runtime")})
	if err != nil {
		d.t.Fatal(err)
	}
	return drv
}

func (d *deployment) stopWorkspace(id string, mode ctrlv1.StopMode) {
	d.t.Helper()
	if _, err := d.client.StopWorkspace(context.Background(), connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Command: cmd(), WorkspaceId: id, Mode: mode})); err != nil {
		d.t.Fatalf("StopWorkspace: %v", err)
	}
}

func TestWorkspaceLifecycle(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()

	ws := d.create(small())
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING || ws.Spec.Template.TemplateId != "base" || ws.Spec.Template.Revision == "" {
		t.Fatalf("created workspace: %v", ws)
	}
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	best := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT)
	if ws.Generation != 1 || best.GetCapacityBytes() != 64*mib || best.Continuity != ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET ||
		best.ResetReason != ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_FIRST_START || ws.Delivery != nil {
		t.Errorf("first start: generation %d, tier %v, delivery %v", ws.Generation, best, ws.Delivery)
	}
	if p := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED); p.Availability != ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_NOT_DECLARED || len(ws.PersistentPaths) != 0 {
		t.Errorf("promised tier without a volume: %v", p)
	}
	if out, err := d.exec(ws, "sh", "-c", "echo kept > /root/marker && echo gone > /tmp/marker && sync"); err != nil {
		t.Fatalf("write markers: %v %s", err, out)
	}

	d.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if ls := ws.LastStop; ls.GetDurability() != ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED ||
		ls.Cause != ctrlv1.StopCause_STOP_CAUSE_REQUESTED || ls.Mode != ctrlv1.StopMode_STOP_MODE_NORMAL || ls.CompletedAt == nil {
		t.Errorf("normal stop: last_stop %v", ls)
	}
	_, err := d.client.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("stop of a STOPPED workspace: %v", err)
	}

	if _, err := d.client.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
		t.Fatal(err)
	}
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	best = testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT)
	if ws.Generation != 2 || best.Continuity != ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_CONTINUED || ws.LastStop != nil {
		t.Errorf("second start: generation %d, tier %v, last_stop %v", ws.Generation, best, ws.LastStop)
	}
	if out, err := d.exec(ws, "cat", "/root/marker"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Errorf("writable layer after stop/start: %q, %v", out, err)
	}
	if out, err := d.exec(ws, "cat", "/tmp/marker"); err == nil {
		t.Errorf("/tmp survived a stop: %q", out)
	}
	_, err = d.client.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("start of an AVAILABLE workspace: %v", err)
	}

	// Memory limit: a process allocating past 128 MiB is killed; the
	// workspace stays AVAILABLE and answers.
	out, err := d.exec(ws, "sh", "-c", "n=$(head -c 400000000 /dev/zero | tr '\\0' x | sort | wc -c); echo sorted:$n")
	// The shell's "Killed" notice may come before or after the echo.
	if err != nil || !slices.Contains(strings.Fields(out), "sorted:0") {
		t.Errorf("allocating 400 MB past a 128 MiB limit: %q, %v; want the sort killed (sorted:0)", out, err)
	}
	if st, err := d.driver().Status(ctx, fmt.Sprintf("%s-%d", ws.WorkspaceId, ws.Generation)); err != nil || !st.OOMKilled || !st.Running {
		t.Errorf("status after the allocation: %+v, %v; want running with an OOM kill", st, err)
	}
	if out, err := d.exec(ws, "echo", "alive"); err != nil || strings.TrimSpace(out) != "alive" {
		t.Errorf("workspace after the allocation: %q, %v", out, err)
	}
	if got := d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE); got.Generation != 2 {
		t.Errorf("generation after OOM = %d", got.Generation)
	}

	d.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_FORCE)
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if ws.LastStop.GetDurability() != ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED || ws.LastStop.Mode != ctrlv1.StopMode_STOP_MODE_FORCE {
		t.Errorf("force stop: %v", ws.LastStop)
	}

	if _, err := d.client.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
		t.Fatal(err)
	}
	deleted := d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	testutil.AssertNothingLeft(t, d.home, ws.WorkspaceId)
	for _, tier := range deleted.RetentionTiers[1:] { // its layer and its tmpfs are gone
		if tier.Availability != ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_UNAVAILABLE || tier.CapacityBytes != nil {
			t.Errorf("a deleted workspace's tier %v", tier)
		}
	}
}

func TestExpirationDeletes(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	spec := small()
	spec.Expiration = &ctrlv1.WorkspaceExpirationPolicy{Deadline: timestamppb.New(time.Now().Add(3 * time.Second)),
		Action: ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE}
	ws := d.create(spec)
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	testutil.AssertNothingLeft(t, d.home, ws.WorkspaceId)

	spec.Expiration = &ctrlv1.WorkspaceExpirationPolicy{Deadline: timestamppb.New(time.Now().Add(3 * time.Second)),
		Action: ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_STOP}
	ws = d.create(spec)
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if ws.LastStop.GetCause() != ctrlv1.StopCause_STOP_CAUSE_EXPIRED {
		t.Errorf("expired stop: %v", ws.LastStop)
	}
}

func TestBadWorkspaceInputsStoreNothing(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	res := func(mem, layer uint64) *ctrlv1.ResourceRequest {
		return &ctrlv1.ResourceRequest{MemoryBytes: mem, WritableLayerBytes: layer}
	}
	past := timestamppb.New(time.Now().Add(-time.Minute))
	cases := map[string]struct {
		req  *ctrlv1.CreateWorkspaceRequest
		code connect.Code
	}{
		"no command":              {&ctrlv1.CreateWorkspaceRequest{Spec: small()}, connect.CodeInvalidArgument},
		"no spec":                 {&ctrlv1.CreateWorkspaceRequest{Command: cmd()}, connect.CodeInvalidArgument},
		"no resources":            {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{}}, connect.CodeInvalidArgument},
		"memory below 128 MiB":    {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(127*mib, 0)}}, connect.CodeInvalidArgument},
		"memory not whole MiB":    {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib+1, 0)}}, connect.CodeInvalidArgument},
		"layer not whole MiB":     {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 64*mib+512)}}, connect.CodeInvalidArgument},
		"unknown template":        {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Template: &ctrlv1.TemplateSelector{TemplateId: "nope"}}}, connect.CodeNotFound},
		"unknown revision":        {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Template: &ctrlv1.TemplateSelector{TemplateId: "base", Revision: "sha256-0000000000000000"}}}, connect.CodeNotFound},
		"unknown capability":      {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Capabilities: &ctrlv1.CapabilityRequirements{Required: []string{"teleport"}}}}, connect.CodeInvalidArgument},
		"absent capability":       {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Capabilities: &ctrlv1.CapabilityRequirements{Required: []string{"runtime.gvisor"}}}}, connect.CodeFailedPrecondition},
		"screen without display":  {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Capabilities: &ctrlv1.CapabilityRequirements{Required: []string{"screen"}}}}, connect.CodeFailedPrecondition},
		"memory beyond the host":  {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(1<<50, 0)}}, connect.CodeResourceExhausted},
		"expiration in the past":  {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Expiration: &ctrlv1.WorkspaceExpirationPolicy{Deadline: past, Action: ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_STOP}}}, connect.CodeInvalidArgument},
		"expiration no action":    {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Expiration: &ctrlv1.WorkspaceExpirationPolicy{Deadline: timestamppb.New(time.Now().Add(time.Hour))}}}, connect.CodeInvalidArgument},
		"DENY_ALL with allow":     {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), NetworkPolicy: &ctrlv1.NetworkPolicy{Allow: []string{"1.1.1.1"}}}}, connect.CodeInvalidArgument},
		"allow not canonical":     {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), NetworkPolicy: &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, Allow: []string{"10.0.0.1/8"}}}}, connect.CodeInvalidArgument},
		"missing egress":          {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), NetworkPolicy: &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, Egresses: []*ctrlv1.NetworkPolicyEgress{{EgressId: "egr_none", Destinations: []string{"1.1.1.1"}}}}}}, connect.CodeNotFound},
		"label key invalid":       {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: small(), Labels: map[string]string{"bad key": "v"}}, connect.CodeInvalidArgument},
		"annotation with NUL":     {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: small(), Annotations: map[string]string{"k": "a\x00"}}, connect.CodeInvalidArgument},
		"volume missing":          {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Volume: &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: "vol_missing"}}}, connect.CodeNotFound},
		"volume NONE with a path": {&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: &ctrlv1.WorkspaceCreateSpec{Resources: res(128*mib, 0), Volume: &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE, MountPath: "/data"}}}, connect.CodeInvalidArgument},
	}
	for name, c := range cases {
		_, err := d.client.CreateWorkspace(ctx, connect.NewRequest(c.req))
		if got := connect.CodeOf(err); got != c.code {
			t.Errorf("%s: %v, want %v", name, err, c.code)
		}
	}
	list, err := d.client.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
	if err != nil || len(list.Msg.Workspaces) != 0 {
		t.Errorf("after bad inputs: %v, %v", list, err)
	}
}

// TestEgressInUseByAPolicy checks that an Egress referenced by a
// workspace's policy cannot be deleted until the workspace is.
func TestEgressInUseByAPolicy(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	token, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	egresses := ctrlv1connect.NewEgressServiceClient(http.DefaultClient, d.url, connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token)))))
	eg, err := egresses.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: cmd(),
		Spec: &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "93.184.216.34:1080"}}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := eg.Msg.Egress.EgressId
	spec := small()
	spec.NetworkPolicy = &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET,
		Egresses: []*ctrlv1.NetworkPolicyEgress{{EgressId: id, Destinations: []string{"203.0.113.0/24"}}}}
	command := cmd()
	created, err := d.client.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: command, Spec: spec}))
	if err != nil {
		t.Fatal(err)
	}
	ws := created.Msg.Workspace
	if ws.Spec.NetworkPolicy.Revision != 1 || ws.Spec.NetworkPolicy.Mode != ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET {
		t.Errorf("stored policy: %v", ws.Spec.NetworkPolicy)
	}
	// The server ignores a policy revision in a request: a retry that
	// differs only there is the same command.
	spec.NetworkPolicy.Revision = 7
	again, err := d.client.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: command, Spec: spec}))
	if err != nil || again.Msg.Workspace.WorkspaceId != ws.WorkspaceId {
		t.Errorf("retry with another policy revision: %v, %v", again, err)
	}
	del := func() error {
		_, err := egresses.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: id}))
		return err
	}
	if err := del(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("delete of an Egress a workspace uses: %v", err)
	}
	if _, err := d.client.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
		t.Fatal(err)
	}
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	if err := del(); err != nil {
		t.Errorf("delete of an Egress after its workspace is deleted: %v", err)
	}
}

// TestGuestShutdownStops: `poweroff` and `halt` inside the guest end its
// execution, released as a forced stop with cause GUEST_SHUTDOWN that the
// caller can start again.
func TestGuestShutdownStops(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	for _, command := range []string{"poweroff", "halt"} {
		ws := d.create(small())
		ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
		d.exec(ws, command) // its process ends with the guest's
		ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
		if ws.LastStop.GetCause() != ctrlv1.StopCause_STOP_CAUSE_GUEST_SHUTDOWN || ws.LastStop.GetMode() != ctrlv1.StopMode_STOP_MODE_FORCE {
			t.Errorf("last_stop after %s: %v", command, ws.LastStop)
		}
		if _, err := d.client.StartWorkspace(context.Background(), connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
			t.Fatal(err)
		}
		if ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE); ws.Generation != 2 {
			t.Errorf("generation after %s and a start = %d", command, ws.Generation)
		}
	}
}

// TestImportedTemplateRuns imports an image archive as `docker save`
// writes it and runs a workspace from it.
func TestImportedTemplateRuns(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	const content = "from an imported image\n"
	templates, imported := d.importTemplate("hello", content)
	if imported.Template.DefaultRevision != imported.Revision.Revision {
		t.Errorf("first revision is not the default: %v", imported.Template)
	}

	spec := small()
	spec.Template = &ctrlv1.TemplateSelector{TemplateId: "hello"}
	ws := d.create(spec)
	if ws.Spec.Template.Revision != imported.Revision.Revision {
		t.Errorf("resolved revision %q, want %q", ws.Spec.Template.Revision, imported.Revision.Revision)
	}
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if out, err := d.exec(ws, "cat", "/hello.txt"); err != nil || out != content {
		t.Errorf("file of the imported layer: %q, %v", out, err)
	}
	// A template a workspace uses cannot be deleted.
	_, err := templates.DeleteTemplate(ctx, connect.NewRequest(&ctrlv1.DeleteTemplateRequest{Command: cmd(), TemplateId: "hello"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("delete of a template in use: %v", err)
	}
}

// importTemplate creates the Template id and imports into it
// testutil.HelloImageArchive: the built-in image with a layer holding
// /hello.txt with content. It returns a TemplateService client and the
// import's response.
func (d *deployment) importTemplate(id, content string) (ctrlv1connect.TemplateServiceClient, *ctrlv1.ImportTemplateRevisionResponse) {
	t := d.t
	t.Helper()
	ctx := context.Background()
	archive := testutil.HelloImageArchive(t, content)

	token, _ := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &protocols}}
	t.Cleanup(h2c.CloseIdleConnections)
	templates := ctrlv1connect.NewTemplateServiceClient(h2c, d.url, connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token)))))
	if _, err := templates.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{Command: cmd(), TemplateId: id})); err != nil {
		t.Fatal(err)
	}
	stream := templates.ImportTemplateRevision(ctx)
	if err := stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Start{Start: &ctrlv1.ImportTemplateRevisionStart{
		Command: cmd(), TemplateId: id, Source: &ctrlv1.ImportTemplateRevisionStart_Archive{Archive: ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL}}}}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(data); off += 1 << 20 {
		if err := stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Chunk{Chunk: data[off:min(off+1<<20, len(data))]}}); err != nil {
			t.Fatal(err)
		}
	}
	imported, err := stream.CloseAndReceive()
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	return templates, imported.Msg
}

// TestMemoryAndDiskGrowWhileStopped changes a stopped workspace's memory
// and grows its disk; the next start has both, and the data stays.
func TestMemoryAndDiskGrow(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	ws := d.create(small()) // 128 MiB memory, 64 MiB disk
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if out, err := d.exec(ws, "sh", "-c", "echo kept > /root/marker && sync"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	memory := func(rev, bytes uint64) (*ctrlv1.Workspace, error) {
		resp, err := unary(ctx, d.client.UpdateWorkspaceMemory, &ctrlv1.UpdateWorkspaceMemoryRequest{
			Command: cmd(), WorkspaceId: ws.WorkspaceId, ExpectedResourcesRevision: rev, MemoryBytes: bytes})
		return resp.GetWorkspace(), err
	}
	disk := func(rev, bytes uint64) (*ctrlv1.Workspace, error) {
		resp, err := unary(ctx, d.client.ResizeWorkspaceWritableLayer, &ctrlv1.ResizeWorkspaceWritableLayerRequest{
			Command: cmd(), WorkspaceId: ws.WorkspaceId, ExpectedResourcesRevision: rev, WritableLayerBytes: bytes})
		return resp.GetWorkspace(), err
	}
	// A raise reaches the running execution at once; its cgroup says so.
	running := func() string {
		b, err := os.ReadFile(fmt.Sprintf("/sys/fs/cgroup/memory/kibotos/%s-%d/memory.limit_in_bytes", ws.WorkspaceId, ws.Generation))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := running(); got != fmt.Sprint(128*mib) {
		t.Fatalf("memory limit %s at start", got)
	}
	if got, err := memory(1, 192*mib); err != nil || got.Spec.ResourcesRevision != 2 {
		t.Fatalf("memory raise while AVAILABLE: %v, %v", got.GetSpec(), err)
	}
	waitFor(t, func() bool { return running() == fmt.Sprint(192*mib) }, "the running execution's memory limit to rise")
	if _, err := memory(2, 128*mib); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("memory lowered while AVAILABLE: %v", err)
	}
	if _, err := memory(2, 1<<50); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a raise beyond the host: %v", err)
	}
	d.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	for name, err := range map[string]error{
		"memory below 128 MiB": func() error { _, err := memory(2, 64*mib); return err }(),
		"memory not whole MiB": func() error { _, err := memory(2, 256*mib+1); return err }(),
		"disk shrinking":       func() error { _, err := disk(2, 32*mib); return err }(),
		"disk not whole MiB":   func() error { _, err := disk(2, 128*mib+7); return err }(),
	} {
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	got, err := memory(2, 256*mib)
	if err != nil || got.Spec.ResourcesRevision != 3 || got.Spec.Resources.MemoryBytes != 256*mib {
		t.Fatalf("memory change: %v, %v", got.GetSpec(), err)
	}
	if _, err := disk(2, 128*mib); connect.CodeOf(err) != connect.CodeAborted {
		t.Errorf("disk with a stale resources_revision: %v", err)
	}
	if got, err = disk(3, 128*mib); err != nil || got.Spec.ResourcesRevision != 4 {
		t.Fatalf("disk grow: %v, %v", got.GetSpec(), err)
	}
	if _, err := d.client.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})); err != nil {
		t.Fatal(err)
	}
	ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if c := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT).GetCapacityBytes(); c != 128*mib {
		t.Errorf("layer capacity after the grow: %d", c)
	}
	if out, err := d.exec(ws, "cat", "/root/marker"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Errorf("data after the grow: %q, %v", out, err)
	}
	out, err := d.exec(ws, "sh", "-c", "df -k / | tail -1")
	if fields := strings.Fields(out); err != nil || len(fields) < 2 || !kibAtLeast(fields[1], 100*1024) {
		t.Errorf("filesystem the guest sees after the grow: %q, %v", out, err)
	}
	limit, err := os.ReadFile(fmt.Sprintf("/sys/fs/cgroup/memory/kibotos/%s-%d/memory.limit_in_bytes", ws.WorkspaceId, ws.Generation))
	if err != nil || strings.TrimSpace(string(limit)) != fmt.Sprint(256*mib) {
		t.Errorf("memory limit of the new execution: %q, %v", limit, err)
	}
}

// kibAtLeast reports whether a df size in KiB is at least min.
func kibAtLeast(s string, min int) bool {
	var n int
	_, err := fmt.Sscan(s, &n)
	return err == nil && n >= min
}
