package sdk

import (
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/sdk/failure"
)

// FailureOf returns the Kibotos ErrorDetail that err carries: the detail of
// a *connect.Error, or for a *StateError one made from the Workspace's
// failure (reason and stage) with the Workspace as observed_workspace. A
// *connect.Error that came with none (a refusal made before the server's
// handlers, such as of a request too large to read, or by a proxy) gets
// one with the reason its code implies, as the server gives its own. It
// looks through wrapped errors and reports false when there is no
// *connect.Error or *StateError, or the code implies no reason
// (failed_precondition).
func FailureOf(err error) (*ctrlv1.ErrorDetail, bool) {
	var se *StateError
	if errors.As(err, &se) {
		f := se.Workspace.GetFailure()
		return &ctrlv1.ErrorDetail{ObservedWorkspace: se.Workspace, Reason: f.GetReason(), Stage: f.GetStage()}, true
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil, false
	}
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		if ed, ok := v.(*ctrlv1.ErrorDetail); ok {
			return ed, true
		}
	}
	if reason := failure.ReasonOf(ce.Code()); reason != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		return &ctrlv1.ErrorDetail{Reason: reason}, true
	}
	return nil, false
}

// StateError reports that a Workspace a call waited for reached a state
// from which it will not get to the one the call wanted: FAILED, whose
// reason Workspace.Failure holds, or another state such as STOPPED while
// waiting for AVAILABLE.
type StateError struct {
	// Workspace is the Workspace as last observed.
	Workspace *ctrlv1.Workspace
	// Want is the state the call waited for.
	Want ctrlv1.WorkspaceState
}

func (e *StateError) Error() string {
	ws := e.Workspace
	if ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED {
		return fmt.Sprintf("workspace %s is %s and will not become %s", ws.GetWorkspaceId(), stateName(ws.GetState()), stateName(e.Want))
	}
	f := ws.GetFailure()
	msg := fmt.Sprintf("workspace %s FAILED: %s", ws.GetWorkspaceId(), strings.TrimPrefix(f.GetReason().String(), "FAILURE_REASON_"))
	if f.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_UNSPECIFIED {
		msg += " at stage " + strings.TrimPrefix(f.GetStage().String(), "FAILURE_STAGE_")
	}
	if f.GetMessage() != "" {
		msg += ": " + f.GetMessage()
	}
	return msg
}

func stateName(s ctrlv1.WorkspaceState) string {
	return strings.TrimPrefix(s.String(), "WORKSPACE_STATE_")
}

// ErrDetached is what Process.Wait returns after Process.Close stopped
// following a process that had not exited. The process runs on in the
// guest; Workspace.Connect attaches to it again.
var ErrDetached = errors.New("detached from the process before it exited")

// OutputError is what Process.Wait returns when the process's output
// could not be written to ExecOptions.Stdout or Stderr (a pipe whose
// reader left, a full disk): the stream ended there, and the process may
// still run.
type OutputError struct {
	// Stream is "stdout" or "stderr".
	Stream string
	Err    error
}

func (e *OutputError) Error() string { return "writing " + e.Stream + ": " + e.Err.Error() }
func (e *OutputError) Unwrap() error { return e.Err }

// sessionExpired reports whether a data-plane call failed because its
// session expired, which a new session cures.
func sessionExpired(err error) bool {
	d, ok := FailureOf(err)
	return ok && d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED
}
