package sdktest

import (
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/sdk"
)

// TestScreenAndInputWithoutDisplay: a Workspace of base has no display;
// the data plane says so through the SDK's errors.
func TestScreenAndInputWithoutDisplay(t *testing.T) {
	ws := newWorkspace(t)
	_, err := ws.Screenshot(t.Context())
	if f, _ := sdk.FailureOf(err); connect.CodeOf(err) != connect.CodeFailedPrecondition || f.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_CAPTURING_SCREEN {
		t.Errorf("Screenshot: %v, want failed_precondition at CAPTURING_SCREEN", err)
	}
	err = ws.Input(t.Context(), sdk.MoveTo(1, 1), sdk.Button(1), sdk.Type("x"), sdk.Scroll(0, 1))
	if f, _ := sdk.FailureOf(err); connect.CodeOf(err) != connect.CodeFailedPrecondition || f.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_DELIVERING_INPUT {
		t.Errorf("Input: %v, want failed_precondition at DELIVERING_INPUT", err)
	}
}
