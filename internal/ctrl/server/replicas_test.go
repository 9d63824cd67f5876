package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/s3blob"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/changes/pgnotify"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/internal/testutil/fakeresolver"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

const replicaHostToken = "replica-host-token"

// replica is one ctrl replica of a deployment on PostgreSQL, with its
// own image store and the deployment's blob store.
type replica struct {
	url    string
	http   *http.Client
	store  store.Store
	images *imagestore.Store
}

// startReplica serves a replica of the database at dbURL until the test
// ends; it returns once the replica listens for the others' changes.
func startReplica(t *testing.T, dbURL string, bucket *blob.Bucket) *replica {
	t.Helper()
	st := testutil.OpenPostgres(t, dbURL)
	images, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	relay := pgnotify.New(dbURL)
	listening := relay.Broker().ChangedID("listening")
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		relay.Run(ctx)
	}()
	<-listening
	ctl, err := server.New(ctx, server.Config{Store: st, Checker: &netcheck.Checker{Resolver: fakeresolver.New(testHosts)},
		Images: images, HostToken: replicaHostToken, Changes: relay.Broker(), Blobs: bucket, TemplateBlobs: bucket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-relayDone
	})
	url, client := ctrltest.Serve(t, ctl.Handler)
	return &replica{url: url, http: client, store: st, images: images}
}

// TestReplicas: two ctrl replicas on one PostgreSQL database and one S3
// blob store. A host's assignment stream on replica 2 wakes on workspaces
// created through replica 1, a watcher on replica 2 sees replica 1's
// changes, and a template imported through replica 1 is delivered by
// replica 2. The log line is the wake-up latency between the replicas,
// from CreateWorkspace's answer on replica 1 to the assignment on
// replica 2.
func TestReplicas(t *testing.T) {
	hosttest.RequireBusybox(t)
	dbURL := testutil.PostgresDatabase(t)
	ctx := t.Context()
	bucket, err := blob.OpenBucket(ctx, testutil.S3(t))
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	one, two := startReplica(t, dbURL, bucket), startReplica(t, dbURL, bucket)
	admin, err := auth.Bootstrap(ctx, one.store, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := templates.EnsureBuiltin(ctx, one.store, one.images, hosttest.Busybox); err != nil {
		t.Fatal(err)
	}
	token := connect.WithInterceptors(bearer.Token(admin))
	wss1 := ctrlv1connect.NewWorkspaceServiceClient(one.http, one.url, token)
	wss2 := ctrlv1connect.NewWorkspaceServiceClient(two.http, two.url, token)
	hosts2 := hostv1connect.NewHostServiceClient(two.http, two.url, connect.WithInterceptors(bearer.Token(replicaHostToken)))

	if _, err := hosts2.RegisterHost(ctx, connect.NewRequest(&hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 64000, MemoryBytes: 256 << 30, LayerBytes: 4 << 40, DefaultLayerBytes: 1 << 30}})); err != nil {
		t.Fatal(err)
	}
	assignments, err := hosts2.WatchAssignments(ctx, connect.NewRequest(&hostv1.WatchAssignmentsRequest{HostId: "h1"}))
	if err != nil {
		t.Fatal(err)
	}
	defer assignments.Close()
	if !assignments.Receive() {
		t.Fatalf("first assignments: %v", assignments.Err())
	}
	assigned := func(id string) {
		t.Helper()
		for assignments.Receive() {
			if slices.ContainsFunc(assignments.Msg().Assignments, func(a *hostv1.Assignment) bool { return a.WorkspaceId == id }) {
				return
			}
		}
		t.Fatalf("the assignments of h1 on replica 2 never named %s: %v", id, assignments.Err())
	}
	const n = 20
	var lat []time.Duration
	var ids []string
	for range n {
		resp, err := wss1.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(),
			Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 250, MemoryBytes: 256 << 20, WritableLayerBytes: 256 << 20}}}))
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		assigned(resp.Msg.Workspace.WorkspaceId)
		lat = append(lat, time.Since(t0))
		ids = append(ids, resp.Msg.Workspace.WorkspaceId)
	}
	slices.Sort(lat)
	t.Logf("assignment wake-up latency between replicas over %d workspaces: p50 %v p90 %v max %v", n, lat[n/2], lat[n*9/10], lat[n-1])

	// A watcher on replica 2 sees the delete made through replica 1.
	watch, err := wss2.WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: ids[0]}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() {
		t.Fatalf("watch: %v", watch.Err())
	}
	first := watch.Msg().Workspace.GetState()
	if _, err := wss1.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: ids[0]})); err != nil {
		t.Fatal(err)
	}
	if !watch.Receive() || watch.Msg().Workspace.GetState() == first {
		t.Fatalf("the watcher on replica 2 did not see the delete through replica 1: %v, %v", watch.Msg(), watch.Err())
	}

	// A template imported through replica 1 is delivered by replica 2,
	// which fetches the layers a host's workspace needs from the blob
	// store.
	tpl1 := ctrlv1connect.NewTemplateServiceClient(one.http, one.url, token)
	if _, err := tpl1.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{Command: cmd(), TemplateId: "hello"})); err != nil {
		t.Fatal(err)
	}
	archive, err := os.ReadFile(testutil.HelloImageArchive(t, "from replica 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	stream := tpl1.ImportTemplateRevision(ctx)
	stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Start{Start: &ctrlv1.ImportTemplateRevisionStart{
		Command: cmd(), TemplateId: "hello", Source: &ctrlv1.ImportTemplateRevisionStart_Archive{
			Archive: ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL}}}})
	for data := archive; len(data) > 0; {
		k := min(len(data), 256<<10)
		stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Chunk{Chunk: data[:k]}})
		data = data[k:]
	}
	imported, err := stream.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := wss1.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(),
		Spec: &ctrlv1.WorkspaceCreateSpec{Template: &ctrlv1.TemplateSelector{TemplateId: "hello", Revision: imported.Msg.Revision.Revision},
			Resources: &ctrlv1.ResourceRequest{CpuMillis: 250, MemoryBytes: 256 << 20, WritableLayerBytes: 256 << 20}}}))
	if err != nil {
		t.Fatal(err)
	}
	assigned(resp.Msg.Workspace.WorkspaceId)
	var layers []string
	for _, a := range assignments.Msg().Assignments {
		if a.WorkspaceId == resp.Msg.Workspace.WorkspaceId {
			for _, l := range a.Template.Layers {
				layers = append(layers, l.Digest)
			}
		}
	}
	if len(layers) == 0 {
		t.Fatal("the workspace of the imported template names no layers")
	}
	for _, d := range layers {
		if two.images.HasBlob(d) {
			t.Fatalf("replica 2 holds %s before any host asked it", d)
		}
		if ok, err := bucket.Exists(ctx, templates.BlobPrefix+strings.TrimPrefix(d, "sha256:")); !ok || err != nil {
			t.Fatalf("the blob store lacks %s: %v", d, err)
		}
		blobs, err := hosts2.GetTemplateBlob(ctx, connect.NewRequest(&hostv1.GetTemplateBlobRequest{HostId: "h1", Digest: d}))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		for blobs.Receive() {
			h.Write(blobs.Msg().Data)
		}
		if err := blobs.Err(); err != nil {
			t.Fatalf("GetTemplateBlob %s from replica 2: %v", d, err)
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != d {
			t.Fatalf("replica 2 delivered %s as %s", d, got)
		}
	}
	// A blob no replica imported is not found.
	missing, err := hosts2.GetTemplateBlob(ctx, connect.NewRequest(&hostv1.GetTemplateBlobRequest{HostId: "h1", Digest: "sha256:" + strings.Repeat("0", 64)}))
	if err == nil {
		for missing.Receive() {
		}
		err = missing.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("GetTemplateBlob of a blob nowhere: %v", err)
	}
}
