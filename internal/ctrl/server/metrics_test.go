package server_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/internal/testutil/promtest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestMetricsCountCalls makes calls that end in several codes, unary and
// streaming, many of them concurrently and while /metrics is scraped, and
// checks that the text format parses and counts each call once by
// service, method and code, and that the census reads the workspace and
// the host it is placed on.
func TestMetricsCountCalls(t *testing.T) {
	s := ctrltest.Start(t)
	s.RegisterHost(t, "h1")
	s.AddBuiltinTemplate(t)
	ctx := context.Background()
	auth := connect.WithInterceptors(bearer.Token(s.AdminToken))
	egresses := ctrlv1connect.NewEgressServiceClient(s.HTTP, s.URL, auth)
	wss := ctrlv1connect.NewWorkspaceServiceClient(s.HTTP, s.URL, auth)
	command := func() *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: uuid.NewString()} }

	const callers, each = 8, 25
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				if _, err := egresses.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: "missing"})); connect.CodeOf(err) != connect.CodeNotFound {
					t.Errorf("GetEgress of a missing Egress: %v", err)
				}
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			promtest.Scrape(t, s.HTTP, s.URL, "")
		}
	})
	if _, err := egresses.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: command(), Spec: socks5("proxy.example.com:1080")})); err != nil {
		t.Fatal(err)
	}
	if _, err := egresses.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: command()})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("CreateEgress without a spec: %v", err)
	}
	anonymous := ctrlv1connect.NewEgressServiceClient(s.HTTP, s.URL)
	if _, err := anonymous.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("ListEgresses without a token: %v", err)
	}
	watch, err := wss.WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: "missing"}))
	if err != nil {
		t.Fatal(err)
	}
	if watch.Receive() || connect.CodeOf(watch.Err()) != connect.CodeNotFound {
		t.Fatalf("WatchWorkspace of a missing workspace: %v", watch.Err())
	}
	watch.Close()
	const memory = 512 << 20
	if _, err := wss.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: command(),
		Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 250, MemoryBytes: memory, WritableLayerBytes: 256 << 20}}})); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	f := promtest.Scrape(t, s.HTTP, s.URL, "")
	egress := "kibotos.ctrl.v1.EgressService"
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kibotos_api_calls_total", []string{"service", egress, "method", "GetEgress", "code", "not_found"}, callers * each},
		{"kibotos_api_calls_total", []string{"service", egress, "method", "GetEgress"}, callers * each},
		{"kibotos_api_call_duration_seconds", []string{"service", egress, "method", "GetEgress"}, callers * each},
		{"kibotos_api_calls_total", []string{"service", egress, "method", "CreateEgress", "code", "ok"}, 1},
		{"kibotos_api_calls_total", []string{"service", egress, "method", "CreateEgress", "code", "invalid_argument"}, 1},
		{"kibotos_api_calls_total", []string{"service", egress, "method", "ListEgresses", "code", "unauthenticated"}, 1},
		{"kibotos_api_calls_total", []string{"service", "kibotos.ctrl.v1.WorkspaceService", "method", "WatchWorkspace", "code", "not_found"}, 1},
		{"kibotos_api_calls_total", []string{"service", "kibotos.ctrl.v1.WorkspaceService", "method", "CreateWorkspace", "code", "ok"}, 1},
		{"kibotos_api_calls_total", []string{"service", "kibotos.host.v1.HostService", "method", "RegisterHost", "code", "ok"}, 1},
		// The census: the workspace is placed on h1, which never reports.
		{"kibotos_workspaces", []string{"state", "creating"}, 1},
		{"kibotos_workspaces", []string{"state", "available"}, 0},
		{"kibotos_workspace_guest_conditions", []string{"condition", "responding"}, 0},
		{"kibotos_workspace_guest_memory_conditions", []string{"condition", "saturated"}, 0},
		{"kibotos_workspace_guest_memory_kills", nil, 0},
		{"kibotos_host_capacity_memory_bytes", []string{"host", "h1"}, 256 << 30},
		{"kibotos_host_reserved_memory_bytes", []string{"host", "h1"}, memory},
		{"kibotos_host_reserved_cpu_millis", []string{"host", "h1"}, 250},
		{"kibotos_host_reserved_layer_bytes", []string{"host", "h1"}, 256 << 20},
	} {
		if got := f.Must(t, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := f.Value("kibotos_workspaces", "state", "deleted"); ok {
		t.Error("kibotos_workspaces has a series for DELETED, which live workspaces never are")
	}
}

// TestMetricsOnlyGET checks that /metrics answers GET alone.
func TestMetricsOnlyGET(t *testing.T) {
	s := ctrltest.Start(t)
	resp, err := s.HTTP.Post(s.URL+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /metrics: %d, want 405", resp.StatusCode)
	}
}

// BenchmarkMetricsScrape measures one GET /metrics of a control plane
// on SQLite holding 1,000 workspaces on one host: the census reads and
// decodes every one of them.
// Run: go test -run '^$' -bench MetricsScrape ./internal/ctrl/server/
func BenchmarkMetricsScrape(b *testing.B) {
	s := ctrltest.Start(b)
	s.RegisterHost(b, "h1")
	s.AddBuiltinTemplate(b)
	wss := ctrlv1connect.NewWorkspaceServiceClient(s.HTTP, s.URL, connect.WithInterceptors(bearer.Token(s.AdminToken)))
	const workspaces = 1000
	for range workspaces {
		if _, err := wss.CreateWorkspace(b.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
			Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
			Spec:    &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 10, MemoryBytes: 128 << 20}}})); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if f := promtest.Scrape(b, s.HTTP, s.URL, ""); f.Must(b, "kibotos_workspaces", "state", "creating") != workspaces {
			b.Fatal("the scrape does not count every workspace")
		}
	}
}
