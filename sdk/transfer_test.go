package sdk

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// restartingTransfers answers GetTransfer unavailable the first two times,
// as a control plane that restarts, then with the Transfer COMPLETE.
type restartingTransfers struct {
	ctrlv1connect.UnimplementedTransferServiceHandler
	calls atomic.Int32
}

func (r *restartingTransfers) GetTransfer(_ context.Context, req *connect.Request[ctrlv1.GetTransferRequest]) (*connect.Response[ctrlv1.GetTransferResponse], error) {
	if r.calls.Add(1) <= 2 {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the server is shutting down"))
	}
	return connect.NewResponse(&ctrlv1.GetTransferResponse{Transfer: &ctrlv1.Transfer{
		TransferId: req.Msg.GetTransferId(), State: ctrlv1.TransferState_TRANSFER_STATE_COMPLETE}}), nil
}

// An export's wait rides through a restart of the control plane: the
// Transfer goes on meanwhile, and a caller who retried the export on
// unavailable would make a second artifact.
func TestAwaitTransferRidesThroughARestart(t *testing.T) {
	r := &restartingTransfers{}
	srv := h2cServer(t, mustHandle(ctrlv1connect.NewTransferServiceHandler(r)))
	c := New(srv.URL, "tok")
	defer c.Close()
	got, err := c.awaitTransfer(t.Context(), &ctrlv1.Transfer{TransferId: "tr_1", State: ctrlv1.TransferState_TRANSFER_STATE_EXPORTING})
	if err != nil || got.GetState() != ctrlv1.TransferState_TRANSFER_STATE_COMPLETE {
		t.Fatalf("awaitTransfer across two unavailable reads: %v, %v; want COMPLETE", got, err)
	}
	if n := r.calls.Load(); n != 3 {
		t.Errorf("%d reads, want 3", n)
	}
}

// mustHandle serves a Connect handler at its path.
func mustHandle(path string, h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(path, h)
	return mux
}
