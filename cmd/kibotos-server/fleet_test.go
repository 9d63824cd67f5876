package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/cafile"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// fleet is a control plane (`kibotos ctrl` on SQLite) and the `kibotos
// host` processes attached to it, each with its own home and port.
type fleet struct {
	t         *testing.T
	bin       string
	home      string // the control plane's
	ctrl      *upProcess
	tokenFile string
	hosts     map[string]*fleetHost
	// Every listener serves TLS with cert and key, which ca signed; the
	// CLI and the hosts trust it through KIBOTOS_CA_FILE, http this
	// test's calls.
	cert, key string
	http      *http.Client
}

type fleetHost struct {
	home string
	proc *upProcess
}

// fleetLease is the host lease of the test's control plane: short, so
// that a killed host is LOST soon.
const fleetLease = "3s"

func newFleet(t *testing.T, bin string) *fleet {
	f := newTLSFleet(t, bin)
	f.startCtrl()
	f.createHostToken()
	return f
}

// newTLSFleet is a fleet whose control plane has yet to start: its
// certificate, trusted by the CLI, the hosts and the test's client.
func newTLSFleet(t *testing.T, bin string) *fleet {
	f := &fleet{t: t, bin: bin, home: filepath.Join(t.TempDir(), "ctrl"), hosts: map[string]*fleetHost{}}
	var ca string
	f.cert, f.key, ca = testtls.Files(t, "127.0.0.1")
	t.Setenv("KIBOTOS_CA_FILE", ca) // the CLI's and the hosts' (--ca-file)
	cfg, err := cafile.Load(ca)
	if err != nil {
		t.Fatal(err)
	}
	f.http = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	return f
}

// startCtrl runs `kibotos ctrl` on the fleet's home, with flags added.
func (f *fleet) startCtrl(flags ...string) {
	f.ctrl = startProcess(f.t, f.bin, append([]string{"ctrl", "--home", f.home, "--listen", "127.0.0.1:0", "--desktop-cache=",
		"--host-lease", fleetLease, "--tls-cert", f.cert, "--tls-key", f.key}, flags...)...)
}

// createHostToken issues the token the fleet's hosts register with.
func (f *fleet) createHostToken() {
	secret := lastLine(f.cli("admin", "host-token", "create", "--name", "fleet test", "--host", "host-a", "--host", "host-b"))
	f.tokenFile = filepath.Join(f.t.TempDir(), "host-token")
	if err := os.WriteFile(f.tokenFile, []byte(secret+"\n"), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// startHost runs (or runs again) `kibotos host` NAME on its own home.
func (f *fleet) startHost(name string) *fleetHost { return f.startHostVia(name, f.url()) }

// startHostVia is startHost with the host reaching the control plane at
// ctrlURL.
func (f *fleet) startHostVia(name, ctrlURL string) *fleetHost {
	h := f.hosts[name]
	if h == nil {
		h = &fleetHost{home: filepath.Join(f.t.TempDir(), name)}
		f.hosts[name] = h
		// Runs after the process is stopped (cleanups run last first):
		// whatever a failure left running is released.
		f.t.Cleanup(func() { releaseContainers(h.home) })
	}
	// No warm pool: these tests count the containers under a host's home.
	h.proc = startProcess(f.t, f.bin, "host", "--ctrl", ctrlURL, "--token-file", f.tokenFile,
		"--home", h.home, "--listen", "127.0.0.1:0", "--name", name, "--volume-size", "64Mi", "--tls-cert", f.cert, "--tls-key", f.key,
		"--warm-pool", "0")
	return h
}

// url is the control plane's.
func (f *fleet) url() string { return "https://" + f.ctrl.addr }

func (f *fleet) cli(args ...string) string {
	f.t.Helper()
	return runCLI(f.t, f.bin, f.home, f.url(), args...)
}

func (f *fleet) auth() connect.ClientOption {
	token, err := os.ReadFile(filepath.Join(f.home, "admin-token"))
	if err != nil {
		f.t.Fatal(err)
	}
	return connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token))))
}

func (f *fleet) workspace(id string) *ctrlv1.Workspace {
	f.t.Helper()
	c := ctrlv1connect.NewWorkspaceServiceClient(f.http, f.url(), f.auth())
	resp, err := c.GetWorkspace(context.Background(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		f.t.Fatalf("GetWorkspace %s: %v", id, err)
	}
	return resp.Msg.Workspace
}

// await polls until ok holds of the workspace; the deadline is for a hang.
func (f *fleet) await(id string, what string, ok func(*ctrlv1.Workspace) bool) *ctrlv1.Workspace {
	f.t.Helper()
	for deadline := time.Now().Add(convergeWithin); ; time.Sleep(100 * time.Millisecond) {
		ws := f.workspace(id)
		if ok(ws) {
			return ws
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("workspace %s: never %s; it is %v", id, what, ws)
		}
	}
}

func (f *fleet) hostList() map[string]*adminv1.Host {
	f.t.Helper()
	var resp adminv1.ListHostsResponse
	if err := protojson.Unmarshal([]byte(f.cli("admin", "host", "list", "-o", "json")), &resp); err != nil {
		f.t.Fatal(err)
	}
	out := map[string]*adminv1.Host{}
	for _, h := range resp.Hosts {
		out[h.HostId] = h
	}
	return out
}

func (f *fleet) createWorkspace() string {
	f.t.Helper()
	var created ctrlv1.CreateWorkspaceResponse
	out := f.cli("ws", "create", "--memory", "128Mi", "--disk", "64Mi", "--wait", "-o", "json")
	if err := protojson.Unmarshal([]byte(out), &created); err != nil {
		f.t.Fatal(err)
	}
	return created.Workspace.WorkspaceId
}

// TestFleet runs `kibotos ctrl` with two `kibotos host` processes on this
// machine, every listener on TLS: placement on both (drain steers it),
// exec through each host's own listener, an exposure URL of its host,
// refusal of a revoked host token, a host SIGKILLed (its
// workspace UNKNOWN within the lease, FORCE stop releases it, start moves
// it to the other host with its layer RESET), and the killed host
// restarted (the stale execution is stopped and everything of it
// released, never resumed), and the hosts' token revoked (both LOST,
// until a new one is written to their token file).
func TestFleet(t *testing.T) {
	hosttest.RequireContainers(t)
	f := newFleet(t, build(t))
	a, b := f.startHost("host-a"), f.startHost("host-b")

	hosts := f.hostList()
	for name, h := range map[string]*fleetHost{"host-a": a, "host-b": b} {
		got := hosts[name]
		if got.GetState() != adminv1.HostState_HOST_STATE_READY || got.GetDataPlaneEndpoint() != "https://"+h.proc.addr ||
			got.GetCapacity().GetMemoryBytes() == 0 || len(got.GetRuntimes()) == 0 || got.GetLastReportAt() == nil {
			t.Fatalf("admin host list: %s is %v, want READY with its endpoint https://%s, capacity and runtimes", name, got, h.proc.addr)
		}
	}
	// A host answers its probes and names its build, as ctrl does.
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "kibotos_build_info{"} {
		resp, err := f.http.Get("https://" + a.proc.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s of a host: %s, want 200 with %q", path, resp.Status, want)
		}
	}

	// Drain steers each workspace to one host; undrain lets the other
	// take placements again.
	f.cli("admin", "host", "drain", "host-b")
	ws1 := f.createWorkspace()
	f.cli("admin", "host", "undrain", "host-b")
	f.cli("admin", "host", "drain", "host-a")
	ws2 := f.createWorkspace()
	f.cli("admin", "host", "undrain", "host-a")
	checkContainers(t, a.home, ws1+"-1")
	checkContainers(t, b.home, ws2+"-1")
	if r := f.hostList()["host-a"].GetReserved(); r.GetMemoryBytes() != 128<<20 || r.GetLayerBytes() != 64<<20 {
		t.Errorf("host-a reserves %v, want its one workspace's 128 MiB and 64 MiB", r)
	}

	// Each workspace's data plane is its host's listener.
	for _, ws := range []string{ws1, ws2} {
		if out := f.cli("ws", "exec", ws, "--", "sh", "-c", "echo from-$0 > /mark; cat /mark", ws); out != "from-"+ws+"\n" {
			t.Errorf("exec in %s: %q", ws, out)
		}
	}

	// An exposure of a port of ws2 is a URL of host-b's listener.
	server := exec.Command(f.bin, "ws", "exec", ws2, "--", "httpd", "-f", "-p", "8080", "-h", "/etc")
	server.Env = append(os.Environ(), "KIBOTOS_HOME="+f.home, "KIBOTOS_ADDR="+f.url())
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })
	var exposed ctrlv1.CreateExposureResponse
	if err := protojson.Unmarshal([]byte(f.cli("ws", "expose", ws2, "8080", "-o", "json")), &exposed); err != nil {
		t.Fatal(err)
	}
	if url := exposed.Exposure.Url; !strings.HasPrefix(url, "https://"+b.proc.addr+"/") {
		t.Errorf("exposure URL %s, want one of host-b's listener https://%s", url, b.proc.addr)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, exposed.Exposure.Url+"passwd", nil)
		req.Header.Set("Authorization", "Bearer "+exposed.Exposure.Token)
		resp, err := f.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exposure on host-b answers %d", resp.StatusCode)
		}
	}
	server.Process.Kill()
	server.Wait()

	// A revoked host token is refused.
	secret := lastLine(f.cli("admin", "host-token", "create", "--name", "revoked", "--host", "host-c"))
	id, _, _ := strings.Cut(secret, ".")
	f.cli("admin", "host-token", "revoke", id)
	hc := hostv1connect.NewHostServiceClient(f.http, f.url(), connect.WithInterceptors(bearer.Token(secret)))
	_, err := hc.RegisterHost(context.Background(), connect.NewRequest(&hostv1.RegisterHostRequest{HostId: "host-c"}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("RegisterHost with a revoked host token: %v, want unauthenticated", err)
	}

	// host-a dies: its workspace is UNKNOWN once the lease runs out, the
	// other host's stays AVAILABLE.
	killed := time.Now()
	a.proc.kill()
	f.await(ws1, "UNKNOWN", func(ws *ctrlv1.Workspace) bool { return ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN })
	t.Logf("UNKNOWN %v after the SIGKILL (lease %s)", time.Since(killed).Round(10*time.Millisecond), fleetLease)
	if st := f.hostList()["host-a"].GetState(); st != adminv1.HostState_HOST_STATE_LOST {
		t.Errorf("host-a is %v, want LOST", st)
	}
	if st := f.workspace(ws2).State; st != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Errorf("workspace %s on host-b is %v", ws2, st)
	}
	// Nothing starts an UNKNOWN workspace; a FORCE stop releases it.
	if err := runCLIErr(f, "ws", "start", ws1); !strings.Contains(err, "failed_precondition") {
		t.Errorf("start of an UNKNOWN workspace: %q, want failed_precondition", err)
	}
	f.cli("ws", "stop", ws1, "--force")
	stopped := f.workspace(ws1)
	if stopped.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED ||
		stopped.GetLastStop().GetDurability() != ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED {
		t.Fatalf("after a FORCE stop of an UNKNOWN workspace: %v, want STOPPED with durability UNCONFIRMED", stopped)
	}

	// It starts on host-b with a new layer.
	started := time.Now()
	f.cli("ws", "start", ws1, "--wait")
	t.Logf("AVAILABLE on host-b %v after ws start", time.Since(started).Round(10*time.Millisecond))
	moved := f.workspace(ws1)
	if moved.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || moved.Generation != 2 {
		t.Fatalf("workspace %s after start: %v", ws1, moved)
	}
	var reset bool
	for _, tier := range moved.RetentionTiers {
		reset = reset || tier.Continuity == ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET &&
			tier.ResetReason == ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_LAYER_UNAVAILABLE
	}
	if !reset {
		t.Errorf("moved workspace's retention tiers %v, want continuity RESET with reason LAYER_UNAVAILABLE", moved.RetentionTiers)
	}
	checkContainers(t, b.home, ws1+"-2", ws2+"-1")
	if out := f.cli("ws", "exec", ws1, "--", "sh", "-c", "cat /mark 2>/dev/null || echo new layer"); out != "new layer\n" {
		t.Errorf("exec in the moved workspace: %q, want a new layer", out)
	}

	// host-a comes back: its stale execution (still running: the agent died,
	// not its containers) is stopped and released, never resumed.
	checkContainers(t, a.home, ws1+"-1")
	a = f.startHost("host-a")
	for deadline := time.Now().Add(convergeWithin); len(containersOf(a.home)) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("host-a still runs %v after it came back", containersOf(a.home))
		}
	}
	f.await(ws1, "kept on host-b", func(ws *ctrlv1.Workspace) bool {
		return ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE && ws.Generation == 2
	})
	if st := f.hostList()["host-a"].GetState(); st != adminv1.HostState_HOST_STATE_READY {
		t.Errorf("host-a is %v after it came back, want READY", st)
	}
	checkReleased(t, a.home, ws1+"-1")
	checkContainers(t, b.home, ws1+"-2", ws2+"-1")
	// The layer ws1 left on host-a is one no workspace will use again:
	// host-a deletes it.
	left := filepath.Join(a.home, "layers", ws1+".ext4")
	for deadline := time.Now().Add(convergeWithin); ; time.Sleep(200 * time.Millisecond) {
		if _, err := os.Stat(left); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("host-a still keeps %s, the layer ws1 left behind", left)
		}
	}

	for _, ws := range []string{ws1, ws2} {
		f.cli("ws", "delete", ws, "--wait")
	}

	// Revoking the hosts' token refuses their reports and ends their
	// assignment streams: both are LOST once the lease runs out.
	for _, tok := range f.hostTokens() {
		if tok.GetName() == "fleet test" {
			f.cli("admin", "host-token", "revoke", tok.GetHostTokenId())
		}
	}
	f.awaitHosts(adminv1.HostState_HOST_STATE_LOST, "with a revoked token")
	// A host the control plane refuses is not ready: a load balancer
	// sends it nothing.
	resp, err := f.http.Get("https://" + a.proc.addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "refuses") {
		t.Errorf("GET /readyz of a refused host: %s %q, want 503 saying why", resp.Status, body)
	}
	// A new token written to the hosts' token file is taken with no
	// restart: both are READY again.
	secret = lastLine(f.cli("admin", "host-token", "create", "--name", "fleet test again", "--host", "host-a", "--host", "host-b"))
	if err := os.WriteFile(f.tokenFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.awaitHosts(adminv1.HostState_HOST_STATE_READY, "given a new token in their token file")
}

// awaitHosts polls until every host of the fleet is in state; the
// deadline is for a hang.
func (f *fleet) awaitHosts(state adminv1.HostState, what string) {
	f.t.Helper()
	for deadline := time.Now().Add(convergeWithin); ; time.Sleep(200 * time.Millisecond) {
		hosts, all := f.hostList(), true
		for name := range f.hosts {
			all = all && hosts[name].GetState() == state
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("hosts %s: %v, want every one %v", what, hosts, state)
		}
	}
}

func (f *fleet) hostTokens() []*adminv1.HostToken {
	f.t.Helper()
	var resp adminv1.ListHostTokensResponse
	if err := protojson.Unmarshal([]byte(f.cli("admin", "host-token", "list", "-o", "json")), &resp); err != nil {
		f.t.Fatal(err)
	}
	return resp.HostTokens
}

// checkContainers checks that exactly these executions run under home.
func checkContainers(t *testing.T, home string, want ...string) {
	t.Helper()
	got := containersOf(home)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("containers under %s: %v, want %v", home, got, want)
	}
}

func containersOf(home string) []string {
	out, _ := exec.Command("runc", "--root", filepath.Join(home, "runtime", "runc"), "list", "-q").Output()
	return strings.Fields(string(out))
}

// checkReleased checks that nothing of an execution is left on the
// machine: no mount or loop device of the host's home, no network
// namespace file, no cgroup.
func checkReleased(t *testing.T, home, execution string) {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, home) {
			t.Errorf("a mount of host-a's home is left: %s", line)
		}
	}
	loops, _ := exec.Command("losetup", "--list", "--noheadings", "--output", "BACK-FILE").Output()
	for _, f := range strings.Fields(string(loops)) {
		if strings.HasPrefix(f, home) {
			t.Errorf("a loop device of %s is left", f)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(home, "netns")); len(entries) > 0 {
		t.Errorf("network namespaces left under host-a's home: %v", entries)
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/kibotos/" + execution)
	more, _ := filepath.Glob("/sys/fs/cgroup/kibotos/" + execution)
	if left := append(cgroups, more...); len(left) > 0 {
		t.Errorf("cgroups of %s are left: %v", execution, left)
	}
}

// releaseContainers stops whatever runs under a host's home and releases
// its network namespaces.
func releaseContainers(home string) {
	if drv, err := oci.New(oci.Config{StateDir: filepath.Join(home, "runtime")}); err == nil {
		for _, id := range containersOf(home) {
			drv.Stop(context.Background(), id, runtime.StopForce, 0)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(home, "netns"))
	for _, e := range entries {
		unix.Unmount(filepath.Join(home, "netns", e.Name()), unix.MNT_DETACH)
	}
}

// TestFleetHostCutOffServesNothing: a host cut off from the control
// plane while its clients still reach it takes itself out of service
// within the lease, before the control plane may hold it LOST and start
// its workspaces elsewhere: its data plane refuses calls, cut off as it
// is, that it would answer for executions no longer its own. It serves
// again once it reaches the control plane again.
func TestFleetHostCutOffServesNothing(t *testing.T) {
	hosttest.RequireContainers(t)
	f := newFleet(t, build(t))
	r := testutil.NewRelay(t, f.ctrl.addr)
	f.startHostVia("host-a", "https://"+r.Addr())
	ws := f.createWorkspace()
	if out := f.cli("ws", "exec", ws, "--", "echo", "served"); out != "served\n" {
		t.Fatalf("exec before the cut: %q", out)
	}

	r.Cut()
	cut := time.Now()
	for deadline := cut.Add(convergeWithin); ; time.Sleep(100 * time.Millisecond) {
		cmd := exec.Command(f.bin, "ws", "exec", ws, "--", "echo", "served")
		cmd.Env = append(os.Environ(), "KIBOTOS_HOME="+f.home, "KIBOTOS_ADDR="+f.url())
		out, err := cmd.CombinedOutput()
		if err != nil && strings.Contains(string(out), "this host is out of service: it has not reached the control plane") {
			t.Logf("out of service %v after the cut (lease %s)", time.Since(cut).Round(10*time.Millisecond), fleetLease)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cut-off host still serves: %v\n%s", err, out)
		}
	}

	r.Heal()
	f.await(ws, "AVAILABLE again", func(w *ctrlv1.Workspace) bool { return w.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE })
	if out := f.cli("ws", "exec", ws, "--", "echo", "again"); out != "again\n" {
		t.Errorf("exec once the host reaches the control plane again: %q", out)
	}
	// Its execution outlived the assignment stream the cut ended.
	f.cli("ws", "stop", ws)
	f.await(ws, "STOPPED", func(w *ctrlv1.Workspace) bool { return w.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED })
}

// runCLIErr runs the CLI, which must fail, and returns its stderr.
func runCLIErr(f *fleet, args ...string) string {
	f.t.Helper()
	cmd := exec.Command(f.bin, args...)
	cmd.Env = append(os.Environ(), "KIBOTOS_HOME="+f.home, "KIBOTOS_ADDR="+f.url())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		f.t.Fatalf("kibotos %s: %v, want a failure\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// TestUpServesTLS: `kibotos up` with a certificate serves the API and the
// data plane over TLS (its own host agent reaches the control plane on
// the same listener), and the CLI trusts the private authority through
// --ca-file.
func TestUpServesTLS(t *testing.T) {
	hosttest.RequireContainers(t)
	bin := build(t)
	cert, key, ca := testtls.Files(t, "127.0.0.1")
	home := filepath.Join(t.TempDir(), "home")
	up := startUp(t, bin, home, "--tls-cert", cert, "--tls-key", key)
	addr := "https://" + up.addr
	var created ctrlv1.CreateWorkspaceResponse
	out := runCLI(t, bin, home, addr, "ws", "create", "--memory", "128Mi", "--disk", "64Mi", "--wait", "-o", "json", "--ca-file", ca)
	if err := protojson.Unmarshal([]byte(out), &created); err != nil {
		t.Fatal(err)
	}
	id := created.Workspace.WorkspaceId
	if out := runCLI(t, bin, home, addr, "ws", "exec", id, "--ca-file", ca, "--", "echo", "over tls"); out != "over tls\n" {
		t.Errorf("exec over TLS: %q", out)
	}
	runCLI(t, bin, home, addr, "ws", "delete", id, "--wait", "--ca-file", ca)
}
