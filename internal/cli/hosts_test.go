package cli

import (
	"slices"
	"testing"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
)

// TestHostRowSizes: a host's capacity is measured, so its row shows it
// to a tenth of its unit, and a host with nothing reserved shows 0.
func TestHostRowSizes(t *testing.T) {
	h := &adminv1.Host{
		HostId:   "rack-1-a",
		Capacity: &adminv1.HostResources{CpuMillis: 8000, MemoryBytes: 24683784 << 10, LayerBytes: 69187352 << 10},
		Reserved: &adminv1.HostResources{CpuMillis: 1000, MemoryBytes: 512 << 20},
	}
	row := hostTable.row(h)
	got := row[3:6]
	if want := []string{"1000m/8000m", "512.0Mi/23.5Gi", "0/66.0Gi"}; !slices.Equal(got, want) {
		t.Errorf("CPU, MEMORY, LAYERS = %q, want %q", got, want)
	}
}
