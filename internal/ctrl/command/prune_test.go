package command_test

import (
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
)

// TestMinRetentionOutlastsTheLongestDrain: a deleted Egress's row, from
// which the hosts hear to close what drains through it, outlives its
// drain.
func TestMinRetentionOutlastsTheLongestDrain(t *testing.T) {
	if drain := resource.MaxDrainSeconds * time.Second; command.MinRetention < drain {
		t.Errorf("MinRetention %s is shorter than the longest drain, %s", command.MinRetention, drain)
	}
}
