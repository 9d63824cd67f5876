package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/sdk/serviceconn"
)

// DialGuestPort connects to a TCP port inside the guest of the
// workspace's execution that runs on this host, as ServiceService's
// ConnectService does for a data-plane caller, but from the host itself
// and without a session: the guest agent dials the port from inside the
// guest's network namespace (its loopback first), over the same data
// socket the gateway uses. ctx bounds only the connecting.
//
// The connection is a *serviceconn.Conn: a net.Conn with deadlines and
// CloseWrite. Its errors are Connect errors with an ErrorDetail:
// unavailable with reason UNAVAILABLE and stage CONNECTING_SERVICE when
// this host runs no execution of the workspace that ctrl wants running
// and that has reported RUNNING, or its guest agent does not answer;
// unavailable with stage CONNECTING_SERVICE when nothing in the guest
// listens on the port; invalid_argument for a port of 0 or above 65535;
// after connecting, unavailable with stage USING_SERVICE when the
// connection fails.
func (a *Agent) DialGuestPort(ctx context.Context, workspaceID string, port uint32) (net.Conn, error) {
	id, ok := a.runningExecution(workspaceID)
	if !ok {
		return nil, unavailableService(fmt.Sprintf("workspace %s is not running on this host", workspaceID))
	}
	client := datav1connect.NewServiceServiceClient(a.guestHTTPClient(), "http://"+a.guestHost(id))
	conn, err := serviceconn.Dial(ctx, client, serviceconn.Addr{Workspace: workspaceID, Port: port})
	if err != nil && connect.CodeOf(err) == connect.CodeUnavailable && !hasDetail(err) {
		// The transport's own error: the guest agent did not answer.
		return nil, unavailableService(fmt.Sprintf("the guest agent of workspace %s does not answer: %v", workspaceID, err))
	}
	return conn, err
}

// guestHTTPClient returns the client of the host's calls to guest agents
// (the gateway's and DialGuestPort's: one HTTP/2 connection per guest),
// made on first use.
func (a *Agent) guestHTTPClient() *http.Client {
	a.guestClientOnce.Do(func() {
		a.guestClient = &http.Client{Transport: a.guestTransport()}
	})
	return a.guestClient
}

// runningExecution returns the ID of the workspace's execution that ctrl
// wants running and that reported RUNNING at its generation.
func (a *Agent) runningExecution(workspaceID string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.byWorkspace[workspaceID] {
		as, _ := e.get()
		if as == nil || as.Desired != hostv1.DesiredState_DESIRED_STATE_RUNNING {
			continue
		}
		if e.reportedRunning(as.Generation) {
			return e.id, true
		}
	}
	return "", false
}

// unavailableService is DialGuestPort's error for a guest it cannot reach.
func unavailableService(msg string) error {
	err := connect.NewError(connect.CodeUnavailable, errors.New(msg))
	if d, derr := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE,
		Stage: ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// hasDetail reports whether err is a Connect error with details, which
// the guest agent's errors have and the transport's do not.
func hasDetail(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && len(ce.Details()) > 0
}
