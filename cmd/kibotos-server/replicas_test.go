package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/encoding/protojson"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// replicaFleet starts two `kibotos ctrl` replicas on one PostgreSQL
// database and one S3 store, each with its own home (its template
// cache) and port; both fleets share the certificate and the host token.
func replicaFleet(t *testing.T, bin string) (one, two *fleet) {
	db := testutil.PostgresDatabase(t)
	blobs := testutil.S3(t) // in this process; its credentials are in the children's environment
	flags := []string{"--store", db, "--blobs", blobs}
	one = newTLSFleet(t, bin)
	one.startCtrl(flags...)
	one.createHostToken()
	two = &fleet{t: t, bin: bin, home: filepath.Join(t.TempDir(), "ctrl-2"), tokenFile: one.tokenFile,
		hosts: map[string]*fleetHost{}, cert: one.cert, key: one.key, http: one.http}
	two.startCtrl(flags...)
	// The database's first admin token was kept by the replica that
	// created it; the CLI of the other reads it from its home.
	token, err := os.ReadFile(filepath.Join(one.home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(two.home, daemon.AdminTokenFile), token, 0o600); err != nil {
		t.Fatal(err)
	}
	return one, two
}

// TestReplicasFleet runs two `kibotos ctrl` replicas on PostgreSQL with
// an S3 store and two `kibotos host` processes, host-a attached to
// replica 1 and host-b to replica 2, every listener on TLS. A template
// imported through replica 1 runs on both hosts (host-b's replica fetches
// its blobs from S3); each workspace is placed through the replica its
// host is not attached to and answers exec through its host's listener;
// a watcher on replica 2 sees every change made through replica 1. The
// log line is the wake-up latency between the replicas: from the answer
// of a labels update on replica 1 to the watcher's message on replica 2.
func TestReplicasFleet(t *testing.T) {
	hosttest.RequireContainers(t)
	one, two := replicaFleet(t, build(t))
	a, b := one.startHost("host-a"), two.startHost("host-b")

	// Both replicas see both hosts, each serving its own data plane.
	for _, r := range []*fleet{one, two} {
		hosts := r.hostList()
		for name, h := range map[string]*fleetHost{"host-a": a, "host-b": b} {
			if got := hosts[name]; got.GetState() != adminv1.HostState_HOST_STATE_READY || got.GetDataPlaneEndpoint() != "https://"+h.proc.addr {
				t.Fatalf("replica %s lists %s as %v, want READY at https://%s", r.ctrl.addr, name, got, h.proc.addr)
			}
		}
	}

	const hello = "imported through replica 1\n"
	one.cli("template", "create", "hello")
	one.cli("template", "import", "hello", testutil.HelloImageArchive(t, hello))

	// Drain steers each workspace to one host; each is created through
	// the replica its host is not attached to.
	create := func(r *fleet) string {
		t.Helper()
		var created ctrlv1.CreateWorkspaceResponse
		out := r.cli("ws", "create", "--template", "hello", "--memory", "128Mi", "--disk", "64Mi", "--wait", "-o", "json")
		if err := protojson.Unmarshal([]byte(out), &created); err != nil {
			t.Fatal(err)
		}
		return created.Workspace.WorkspaceId
	}
	two.cli("admin", "host", "drain", "host-a")
	onB := create(one)
	one.cli("admin", "host", "undrain", "host-a")
	one.cli("admin", "host", "drain", "host-b")
	onA := create(two)
	two.cli("admin", "host", "undrain", "host-b")
	checkContainers(t, a.home, onA+"-1")
	checkContainers(t, b.home, onB+"-1")

	// Exec reaches each workspace through its host's listener, whichever
	// replica the CLI asks for the session.
	for _, r := range []*fleet{one, two} {
		for _, ws := range []string{onA, onB} {
			if out := r.cli("ws", "exec", ws, "--", "cat", "/hello.txt"); out != hello {
				t.Errorf("exec in %s through replica %s: %q, want %q", ws, r.ctrl.addr, out, hello)
			}
		}
	}

	// A watcher on replica 2 wakes on each labels update made through
	// replica 1.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws1 := ctrlv1connect.NewWorkspaceServiceClient(one.http, one.url(), one.auth())
	ws2 := ctrlv1connect.NewWorkspaceServiceClient(two.http, two.url(), two.auth())
	watch, err := ws2.WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: onB}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() {
		t.Fatalf("watch on replica 2: %v", watch.Err())
	}
	revision := watch.Msg().Workspace.GetLabelsRevision()
	const n = 20
	var lat []time.Duration
	for i := range n {
		resp, err := ws1.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{
			Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, WorkspaceId: onB,
			ExpectedLabelsRevision: revision, Labels: map[string]string{"n": strconv.Itoa(i)}}))
		if err != nil {
			t.Fatal(err)
		}
		answered := time.Now()
		revision = resp.Msg.Workspace.GetLabelsRevision()
		for watch.Msg().Workspace.GetLabels()["n"] != strconv.Itoa(i) {
			if !watch.Receive() {
				t.Fatalf("the watcher on replica 2 never saw labels update %d through replica 1: %v", i, watch.Err())
			}
		}
		lat = append(lat, time.Since(answered))
	}
	slices.Sort(lat)
	t.Logf("watch wake-up latency between replicas over %d updates: p50 %v p90 %v max %v",
		n, lat[n/2].Round(time.Microsecond), lat[n*9/10].Round(time.Microsecond), lat[n-1].Round(time.Microsecond))

	// A delete through replica 2 reaches host-a through replica 1.
	two.cli("ws", "delete", onA, "--wait")
	checkContainers(t, a.home)
	one.cli("ws", "delete", onB, "--wait")
	checkContainers(t, b.home)
}
