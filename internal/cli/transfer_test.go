package cli

import (
	"context"
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
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

// gettingTransfers is a TransferService whose GetTransfer answers from a
// list, one answer a call.
type gettingTransfers struct {
	ctrlv1connect.TransferServiceClient
	answers []func() (*ctrlv1.Transfer, error)
}

func (g *gettingTransfers) GetTransfer(context.Context, *connect.Request[ctrlv1.GetTransferRequest]) (*connect.Response[ctrlv1.GetTransferResponse], error) {
	next := g.answers[0]
	g.answers = g.answers[1:]
	t, err := next()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.GetTransferResponse{Transfer: t}), nil
}

// TestFollowTransferThroughARestart: a control plane unavailable for a
// moment (a restart) is waited out, and an error that ends the following
// names the Transfer.
func TestFollowTransferThroughARestart(t *testing.T) {
	tr := &ctrlv1.Transfer{TransferId: "tr_x", State: ctrlv1.TransferState_TRANSFER_STATE_RESTORING}
	down := func() (*ctrlv1.Transfer, error) {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("connection refused"))
	}
	done := func() (*ctrlv1.Transfer, error) {
		return &ctrlv1.Transfer{TransferId: "tr_x", State: ctrlv1.TransferState_TRANSFER_STATE_RESTORED}, nil
	}
	cl := &gettingTransfers{answers: []func() (*ctrlv1.Transfer, error){down, down, done}}
	got, err := followTransfer(t.Context(), cl, tr, "restoring", newStatusLine(&strings.Builder{}))
	if err != nil || got.GetState() != ctrlv1.TransferState_TRANSFER_STATE_RESTORED {
		t.Errorf("followTransfer through a restart: %v, %v; want RESTORED", got, err)
	}

	gone := func() (*ctrlv1.Transfer, error) {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("the token was revoked"))
	}
	cl = &gettingTransfers{answers: []func() (*ctrlv1.Transfer, error){gone}}
	_, err = followTransfer(t.Context(), cl, tr, "restoring", newStatusLine(&strings.Builder{}))
	if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "kibotos transfer get tr_x") {
		t.Errorf("followTransfer refused: %v, want the refusal naming the transfer", err)
	}
}
