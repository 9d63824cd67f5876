package failure

import (
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestReasonOfEveryCode: every code but failed_precondition implies a
// reason.
func TestReasonOfEveryCode(t *testing.T) {
	for code := connect.Code(1); code <= connect.CodeUnauthenticated; code++ {
		got := ReasonOf(code)
		if (got == ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED) != (code == connect.CodeFailedPrecondition) {
			t.Errorf("ReasonOf(%v) = %v", code, got)
		}
	}
}
