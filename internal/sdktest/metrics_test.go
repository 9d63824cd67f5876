package sdktest

import (
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/sdk"
)

// TestMetrics: a Workspace's figures through the SDK: its limit, its
// writable layer as df sees it inside, no Volume, and CPU time that a
// busy process makes grow.
func TestMetrics(t *testing.T) {
	ws := newWorkspace(t)
	first, err := ws.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if first.GetMemoryLimitBytes() != small.MemoryBytes || first.GetProcesses() < 1 || first.GetReadAt() == nil ||
		first.GetVolumeCapacityBytes() != 0 || first.GetVolumeUsedBytes() != 0 {
		t.Errorf("Metrics = %v", first)
	}
	// df / inside: the overlay reports its writable layer's filesystem.
	df := strings.Fields(strings.Split(strings.TrimSpace(sh(t, ws, "df -P -B1 /")), "\n")[1])
	size, _ := strconv.ParseUint(df[1], 10, 64)
	if size != first.GetWritableLayerCapacityBytes() || size > small.DiskBytes {
		t.Errorf("layer capacity %d, df / %d, requested %d", first.GetWritableLayerCapacityBytes(), size, small.DiskBytes)
	}
	sh(t, ws, "i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done")
	second, err := ws.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if second.GetCpuUsageSeconds() <= first.GetCpuUsageSeconds() || !second.GetReadAt().AsTime().After(first.GetReadAt().AsTime()) {
		t.Errorf("after a busy loop: CPU %v s at %v, before %v s at %v", second.GetCpuUsageSeconds(), second.GetReadAt().AsTime(),
			first.GetCpuUsageSeconds(), first.GetReadAt().AsTime())
	}
}

func TestMetricsOfAStoppedWorkspace(t *testing.T) {
	c := newClient(t)
	ws, err := c.CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StopWorkspace(t.Context(), ws.ID(), sdk.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	// No session is issued for it.
	_, err = ws.Metrics(t.Context())
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("Metrics of a stopped workspace: %v, want failed_precondition", err)
	}
}
