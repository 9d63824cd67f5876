package server_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestWatchEndsAtShutdown: a shutdown ends a watch at once, unavailable
// with the reason, rather than waiting out the grace period of calls in
// flight for a stream that never ends on its own.
func TestWatchEndsAtShutdown(t *testing.T) {
	const hostToken = "shutdown-host-token"
	ctl, _ := ctrltest.New(t, testutil.SQLiteStore(t), server.Config{HostToken: hostToken})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- server.Serve(ctx, ln, ctl.Handler, time.Hour) }()
	hosts := hostv1connect.NewHostServiceClient(http.DefaultClient, "http://"+ln.Addr().String(), connect.WithInterceptors(bearer.Token(hostToken)))
	if _, err := hosts.RegisterHost(t.Context(), connect.NewRequest(&hostv1.RegisterHostRequest{HostId: "h1",
		Capacity: &hostv1.HostCapacity{CpuMillis: 1000, MemoryBytes: 1 << 30, LayerBytes: 1 << 30, DefaultLayerBytes: 1 << 28}})); err != nil {
		t.Fatal(err)
	}
	// Several watches end together, each with an error of its own (the
	// race detector sees one shared).
	const watches = 4
	ended := make(chan error, watches)
	for range watches {
		watch, err := hosts.WatchAssignments(t.Context(), connect.NewRequest(&hostv1.WatchAssignmentsRequest{HostId: "h1"}))
		if err != nil {
			t.Fatal(err)
		}
		defer watch.Close()
		if !watch.Receive() {
			t.Fatalf("first assignments: %v", watch.Err())
		}
		go func() {
			for watch.Receive() {
			}
			ended <- watch.Err()
		}()
	}
	cancel()
	for range watches {
		select {
		case err := <-ended:
			if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "shutting down") {
				t.Errorf("a watch at shutdown ended with %v, want unavailable: shutting down", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a watch still runs a minute after the server's shutdown began")
		}
	}
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}
