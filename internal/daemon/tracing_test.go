package daemon_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil/otlptest"
)

// TestTracesOfBothPlanes: `kibotos up` with an OTLP endpoint exports a
// span of each control-plane call and of each data-plane call its
// gateway serves, here a workspace's creation and a file written and
// read through the SDK.
func TestTracesOfBothPlanes(t *testing.T) {
	col := otlptest.Start(t)
	d := upWith(t, t.TempDir(), daemon.Options{OTLPEndpoint: col.URL})
	defer d.stop()
	ctx := context.Background()
	ws := d.sdkWorkspace(128*mib, 64*mib)
	if err := ws.WriteFile(ctx, "/tmp/traced", []byte("traced"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ws.ReadFile(ctx, "/tmp/traced"); err != nil || string(got) != "traced" {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
	// The file's bytes go on the file bytes path, which the SDK first asks
	// with a GET whether it is served; its listing takes FileService.
	if _, err := ws.List(ctx, "/tmp", 1); err != nil {
		t.Fatal(err)
	}
	want := []string{"kibotos.ctrl.v1.WorkspaceService/CreateWorkspace", "kibotos.ctrl.v1.SessionService/IssueSession",
		"PUT kibotos.data.v1.files", "GET kibotos.data.v1.files", "kibotos.data.v1.FileService/ListDirectory"}
	// The exporter sends its batches every few seconds.
	eventually(t, time.Minute, "spans of "+fmt.Sprint(want), func() ([]string, error) {
		spans, _ := col.Spans()
		var names []string
		for _, s := range spans {
			names = append(names, s.GetName())
		}
		return names, nil
	}, func(names []string) bool {
		for _, w := range want {
			if !slices.Contains(names, w) {
				return false
			}
		}
		return true
	})
}
