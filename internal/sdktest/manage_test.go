package sdktest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/sdk"
)

func TestListAndWatchWorkspaces(t *testing.T) {
	c := newClient(t)
	opts := small
	opts.Labels = map[string]string{"team": "ml"}
	ws, err := c.CreateWorkspace(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for sel, want := range map[string]int{"ml": 1, "web": 0} {
		got, err := c.ListWorkspaces(t.Context(), map[string]string{"team": sel})
		if err != nil || len(got) != want {
			t.Errorf("ListWorkspaces(team=%s) = %d workspaces, %v; want %d", sel, len(got), err, want)
		}
	}
	if _, err := c.ListWorkspaces(t.Context(), map[string]string{"": "x"}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a bad selector: %v, want invalid_argument", err)
	}

	// The watch yields the workspace as it is, then the change of labels.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	seen := make(chan *ctrlv1.Workspace)
	go func() {
		defer close(seen)
		for w, err := range c.WatchWorkspace(ctx, ws.ID()) {
			if err != nil {
				return
			}
			select {
			case seen <- w:
			case <-ctx.Done():
				return
			}
		}
	}()
	if first := <-seen; first.GetLabels()["team"] != "ml" {
		t.Fatalf("the watch began with labels %v", first.GetLabels())
	}
	if _, err := ws.SetLabels(t.Context(), map[string]string{"team": "web"}); err != nil {
		t.Fatal(err)
	}
	for w := range seen {
		if w.GetLabels()["team"] == "web" {
			break
		}
	}
	cancel()
	for range seen { // until the watch has ended
	}
}

func TestUpdateWorkspace(t *testing.T) {
	ws := newWorkspace(t)
	before := ws.Info().GetLabelsRevision()
	info, err := ws.SetLabels(t.Context(), map[string]string{"a": "1"})
	if err != nil || info.GetLabels()["a"] != "1" || info.GetLabelsRevision() != before+1 || ws.Info() != info {
		t.Errorf("SetLabels = %v, %v", info, err)
	}
	if _, err := ws.SetLabels(t.Context(), map[string]string{"bad key!": "1"}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a bad label: %v, want invalid_argument", err)
	}
	info, err = ws.SetAnnotations(t.Context(), map[string]string{"note": "long text"})
	if err != nil || info.GetAnnotations()["note"] != "long text" {
		t.Errorf("SetAnnotations = %v, %v", info.GetAnnotations(), err)
	}

	policy := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET}
	info, err = ws.SetNetworkPolicy(t.Context(), policy)
	if err != nil || info.GetSpec().GetNetworkPolicy().GetMode() != policy.Mode {
		t.Errorf("SetNetworkPolicy = %v, %v", info.GetSpec().GetNetworkPolicy(), err)
	}
	bad := &ctrlv1.NetworkPolicy{Mode: policy.Mode, Allow: []string{"not an address"}}
	if _, err := ws.SetNetworkPolicy(t.Context(), bad); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a policy with a bad rule: %v, want invalid_argument", err)
	}

	now := time.Now()
	info, err = ws.SetTimeout(t.Context(), time.Hour)
	exp := info.GetExpiration().GetPolicy()
	if err != nil || exp.GetAction() != ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE ||
		exp.GetDeadline().AsTime().Before(now.Add(time.Hour)) {
		t.Errorf("SetTimeout = %v, %v", info.GetExpiration(), err)
	}
	if _, err := ws.SetTimeout(t.Context(), -time.Minute); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a deadline in the past: %v, want invalid_argument", err)
	}
	if info, err = ws.SetExpiration(t.Context(), nil); err != nil || info.GetExpiration().GetPolicy() != nil {
		t.Errorf("SetExpiration(nil) = %v, %v", info.GetExpiration(), err)
	}
}

// An Exec whose context ends kills its process; Process.Kill kills a
// started one.
func TestExecContextKillsAndProcessKill(t *testing.T) {
	ws := newWorkspace(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := ws.Exec(ctx, []string{"sleep", "1000"}, sdk.ExecOptions{Tag: "sleeper"})
		done <- err
	}()
	waitProcess(t, ws, "sleeper", func(p running) bool { return p.found && p.exited == "" })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "killing") {
		t.Errorf("Exec after its context ended: %v, want context.Canceled", err)
	}
	waitProcess(t, ws, "sleeper", func(p running) bool { return p.exited == "SIGKILL" })

	// A deadline travels with the call in whole milliseconds; the stream
	// the data plane ends at it is the deadline's end too.
	ctx, cancel = context.WithTimeout(t.Context(), 500*time.Millisecond+900*time.Microsecond)
	defer cancel()
	if _, err := ws.Exec(ctx, []string{"sleep", "1000"}, sdk.ExecOptions{Tag: "late"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Exec past its deadline: %v, want context.DeadlineExceeded", err)
	}
	waitProcess(t, ws, "late", func(p running) bool { return p.exited == "SIGKILL" })

	p, err := ws.Start(t.Context(), []string{"sleep", "1000"}, sdk.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(); err != nil || st.Signal != "SIGKILL" {
		t.Errorf("Wait after Kill = %v, %v", st, err)
	}
}

// running is what Processes says of one process.
type running struct {
	found  bool
	exited string // the signal that ended it
}

// waitProcess waits until the process tagged tag satisfies ok, and fails
// the test after a minute.
func waitProcess(t *testing.T, ws *sdk.Workspace, tag string, ok func(running) bool) {
	t.Helper()
	giveUp := time.After(time.Minute)
	for {
		procs, err := ws.Processes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var r running
		for _, p := range procs {
			if p.GetTag() == tag {
				r = running{found: true, exited: p.GetExited().GetSignal()}
			}
		}
		if ok(r) {
			return
		}
		select {
		case <-giveUp:
			t.Fatalf("process %s: %+v", tag, r)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestDefaultEnv(t *testing.T) {
	d := uptest.Shared(t)
	c := sdk.New(d.URL+"/", d.Project(t), sdk.WithEnv(map[string]string{"A": "client", "B": "client"}))
	t.Cleanup(c.Close)
	ws, err := c.CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetEnv(map[string]string{"B": "ws", "C": "ws"})
	var out bytes.Buffer
	if _, err := ws.Exec(t.Context(), []string{"sh", "-c", `echo $A $B $C $D`}, sdk.ExecOptions{Env: map[string]string{"C": "exec", "D": "exec"}, Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "client ws exec exec\n" {
		t.Errorf("environment = %q, want the client's, the workspace's and the exec's, each over the one before", got)
	}
}

func TestVolumes(t *testing.T) {
	c := newClient(t)
	v, err := c.CreateVolume(t.Context(), sdk.VolumeOptions{CapacityBytes: 64 << 20, Labels: map[string]string{"kind": "cache"}})
	if err != nil {
		t.Fatal(err)
	}
	if v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.GetSpec().GetCapacityBytes() != 64<<20 {
		t.Errorf("CreateVolume = %v", v)
	}
	if list, err := c.ListVolumes(t.Context(), map[string]string{"kind": "cache"}); err != nil || len(list) != 1 {
		t.Errorf("ListVolumes = %v, %v", list, err)
	}
	if _, err := c.CreateVolume(t.Context(), sdk.VolumeOptions{CapacityBytes: 1}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a capacity not in MiB: %v, want invalid_argument", err)
	}

	opts := small
	opts.Volume = &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: v.GetVolumeId(), MountPath: "/data"}
	ws, err := c.CreateWorkspace(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	sh(t, ws, "echo kept > /data/f")
	if _, err := c.DeleteVolume(t.Context(), v.GetVolumeId()); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("deleting a bound volume: %v, want failed_precondition", err)
	}
	if err := c.DeleteWorkspace(t.Context(), ws.ID()); err != nil {
		t.Fatal(err)
	}
	// A BOUND binding keeps the volume when its workspace goes.
	ws, err = c.CreateWorkspace(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ws, "cat /data/f"); got != "kept\n" {
		t.Errorf("the volume holds %q", got)
	}
	if err := c.DeleteWorkspace(t.Context(), ws.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteVolume(t.Context(), v.GetVolumeId()); err != nil {
		t.Fatal(err)
	}
}

func TestTemplates(t *testing.T) {
	d := uptest.Shared(t)
	c := newClient(t)
	img, err := imagestore.BuiltinImage(imagestore.DefaultBusybox)
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if err := tarball.Write(name.MustParseReference("kibotos.test/busybox:1"), img, &archive); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTemplate(t.Context(), "from-file", nil); err != nil {
		t.Fatal(err)
	}
	got, err := c.ImportTemplate(t.Context(), "from-file", &archive, sdk.ImportOptions{})
	if err != nil || got.GetTemplate().GetDefaultRevision() != got.GetRevision().GetRevision() {
		t.Fatalf("ImportTemplate = %v, %v", got, err)
	}
	if _, err := c.ImportTemplate(t.Context(), "from-file", bytes.NewReader([]byte("not a tar")), sdk.ImportOptions{}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("importing garbage: %v, want invalid_argument", err)
	}

	ref := d.Registry + "/busybox:1"
	parsed, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTemplate(t.Context(), "pulled", map[string]string{"src": "registry"}); err != nil {
		t.Fatal(err)
	}
	got, err = c.ImportTemplateFromRegistry(t.Context(), "pulled", ref, sdk.ImportOptions{})
	if err != nil || got.GetRevision().GetSource() != "registry:"+ref {
		t.Fatalf("ImportTemplateFromRegistry = %v, %v", got, err)
	}
	if _, err := c.ImportTemplateFromRegistry(t.Context(), "pulled", d.Registry+"/busybox:missing", sdk.ImportOptions{}); err == nil {
		t.Error("a missing tag was imported")
	}
	opts := small
	opts.Template = "pulled"
	ws, err := c.CreateWorkspace(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if out := sh(t, ws, "echo from the registry"); out != "from the registry\n" {
		t.Errorf("exec in a workspace of the pulled template: %q", out)
	}
}
