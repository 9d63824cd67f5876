// Package failure is the one mapping of a Connect code to the
// FailureReason it implies, which the servers attach to a refusal that
// names no reason of its own and the SDK gives a refusal that came with no
// ErrorDetail at all (one made before a server's handlers, such as a
// request too large to read).
package failure

import (
	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// ReasonOf returns the FailureReason that a Connect code implies, or
// UNSPECIFIED for failed_precondition, whose reasons are the caller's
// state and are given where they are known.
func ReasonOf(code connect.Code) ctrlv1.FailureReason {
	switch code {
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return ctrlv1.FailureReason_FAILURE_REASON_INVALID_REQUEST
	case connect.CodeNotFound:
		return ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return ctrlv1.FailureReason_FAILURE_REASON_CONFLICT
	case connect.CodeResourceExhausted:
		return ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED
	case connect.CodeUnauthenticated:
		return ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED
	case connect.CodePermissionDenied:
		return ctrlv1.FailureReason_FAILURE_REASON_PERMISSION_DENIED
	case connect.CodeUnavailable:
		return ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE
	case connect.CodeDeadlineExceeded:
		return ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT
	case connect.CodeUnimplemented:
		return ctrlv1.FailureReason_FAILURE_REASON_UNSUPPORTED
	case connect.CodeCanceled:
		return ctrlv1.FailureReason_FAILURE_REASON_CANCELLED
	case connect.CodeInternal, connect.CodeDataLoss, connect.CodeUnknown:
		return ctrlv1.FailureReason_FAILURE_REASON_INTERNAL
	}
	return ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED
}
