package dataplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/sdk/failure"
)

// stageT is a failure stage of ErrorDetail.
type stageT = ctrlv1.FailureStage

// The stages this package reports in ErrorDetail.
const (
	stageReadingFile       = ctrlv1.FailureStage_FAILURE_STAGE_READING_FILE
	stageWritingFile       = ctrlv1.FailureStage_FAILURE_STAGE_WRITING_FILE
	stageDeletingFile      = ctrlv1.FailureStage_FAILURE_STAGE_DELETING_FILE
	stageInspectingFile    = ctrlv1.FailureStage_FAILURE_STAGE_INSPECTING_FILE
	stageMovingFile        = ctrlv1.FailureStage_FAILURE_STAGE_MOVING_FILE
	stageCreatingDirectory = ctrlv1.FailureStage_FAILURE_STAGE_CREATING_DIRECTORY
	stageWatchingDirectory = ctrlv1.FailureStage_FAILURE_STAGE_WATCHING_DIRECTORY
	stageStartingProcess   = ctrlv1.FailureStage_FAILURE_STAGE_STARTING_PROCESS
	stageStreamingProcess  = ctrlv1.FailureStage_FAILURE_STAGE_STREAMING_PROCESS
	stageUsingProcess      = ctrlv1.FailureStage_FAILURE_STAGE_USING_PROCESS
)

// newError returns a Connect error of code with the stage attached.
func newError(code connect.Code, stage ctrlv1.FailureStage, format string, args ...any) *connect.Error {
	return withStage(connect.NewError(code, fmt.Errorf(format, args...)), stage)
}

// withStage attaches an ErrorDetail naming stage, and the reason e's code
// implies, to e.
func withStage(e *connect.Error, stage ctrlv1.FailureStage) *connect.Error {
	if d, err := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Reason: failure.ReasonOf(e.Code()), Stage: stage}); err == nil {
		e.AddDetail(d)
	}
	return e
}

// toConnect converts err to a Connect error of the code errorCode gives,
// with the stage attached. A Connect error passes through unchanged.
func toConnect(stage ctrlv1.FailureStage, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	return withStage(connect.NewError(errorCode(err), err), stage)
}

// errorCode maps an error to a Connect code. File errors keep their errno
// meaning: ENOENT not_found, EEXIST already_exists, EACCES and EPERM
// permission_denied, ENOSPC and EDQUOT resource_exhausted, ENOTDIR,
// EISDIR and ENOTEMPTY failed_precondition (as the proto says); besides,
// errors of the caller's input (EINVAL, ENAMETOOLONG, ELOOP, E2BIG: an
// argument list or environment too long to exec) are
// invalid_argument, a state the caller can change (EROFS, EXDEV, EBUSY,
// ETXTBSY, ENOEXEC) failed_precondition, anything else internal.
func errorCode(err error) connect.Code {
	switch {
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		if errors.Is(err, os.ErrNotExist) {
			return connect.CodeNotFound
		}
		return connect.CodeInternal
	}
	switch errno {
	case syscall.ENOENT:
		return connect.CodeNotFound
	case syscall.EEXIST:
		return connect.CodeAlreadyExists
	case syscall.EACCES, syscall.EPERM:
		return connect.CodePermissionDenied
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EMFILE, syscall.ENFILE:
		return connect.CodeResourceExhausted
	case syscall.ENOTDIR, syscall.EISDIR, syscall.ENOTEMPTY,
		syscall.EROFS, syscall.EXDEV, syscall.EBUSY, syscall.ETXTBSY, syscall.ENOEXEC:
		return connect.CodeFailedPrecondition
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP, syscall.E2BIG:
		return connect.CodeInvalidArgument
	}
	return connect.CodeInternal
}
