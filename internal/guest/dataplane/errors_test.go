package dataplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"connectrpc.com/connect"
)

func TestErrorCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		code connect.Code
	}{
		{&os.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, connect.CodeNotFound},
		{fmt.Errorf("wrapped: %w", syscall.EEXIST), connect.CodeAlreadyExists},
		{syscall.EACCES, connect.CodePermissionDenied},
		{syscall.EPERM, connect.CodePermissionDenied},
		{&os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, connect.CodeResourceExhausted},
		{syscall.EDQUOT, connect.CodeResourceExhausted},
		{syscall.ENOTDIR, connect.CodeFailedPrecondition},
		{syscall.EISDIR, connect.CodeFailedPrecondition},
		{syscall.ENOTEMPTY, connect.CodeFailedPrecondition},
		{&os.LinkError{Op: "rename", Old: "a", New: "b", Err: syscall.EXDEV}, connect.CodeFailedPrecondition},
		{syscall.ENAMETOOLONG, connect.CodeInvalidArgument},
		{syscall.EIO, connect.CodeInternal},
		{errors.New("other"), connect.CodeInternal},
		{context.Canceled, connect.CodeCanceled},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded},
	} {
		if got := errorCode(c.err); got != c.code {
			t.Errorf("errorCode(%v) = %v, want %v", c.err, got, c.code)
		}
		wantCode(t, toConnect(stageWritingFile, c.err), c.code, stageWritingFile)
	}
	// A Connect error keeps its code and detail.
	e := newError(connect.CodeAborted, stageMovingFile, "x")
	wantCode(t, toConnect(stageReadingFile, e), connect.CodeAborted, stageMovingFile)
}
