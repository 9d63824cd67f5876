package cli

import (
	"context"
	"strings"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestFollowTransferInterrupted: a command interrupted while it follows
// a Transfer says so, naming the Transfer whose work goes on.
func TestFollowTransferInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	tr := &ctrlv1.Transfer{TransferId: "tr_x", State: ctrlv1.TransferState_TRANSFER_STATE_EXPORTING}
	_, err := followTransfer(ctx, nil, tr, "exporting", newStatusLine(&strings.Builder{}))
	if err == nil || !strings.HasPrefix(err.Error(), "canceled: ") || !strings.Contains(err.Error(), "kibotos transfer get tr_x") {
		t.Errorf("followTransfer after an interrupt: %v", err)
	}
}
