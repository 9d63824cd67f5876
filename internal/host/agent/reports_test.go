package agent

import (
	"fmt"
	"syscall"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestReasonOfAFullDisk: a failure for want of space (a workspace's disk
// full at its start, say) is RESOURCE_EXHAUSTED, not INTERNAL.
func TestReasonOfAFullDisk(t *testing.T) {
	err := fmt.Errorf("oci: the workspace's disk has no space or inodes left to start on: %w", syscall.ENOSPC)
	if got := reasonOf(err); got != ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED {
		t.Errorf("reason of %v: %v, want RESOURCE_EXHAUSTED", err, got)
	}
}
