package errdetail

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// detailOf returns the first ErrorDetail of err, nil when it has none.
func detailOf(t *testing.T, err error) *ctrlv1.ErrorDetail {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("%v is not a Connect error", err)
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if ed, ok := v.(*ctrlv1.ErrorDetail); ok {
				return ed
			}
		}
	}
	return nil
}

func withDetail(code connect.Code, detail *ctrlv1.ErrorDetail) *connect.Error {
	err := connect.NewError(code, errors.New("refused"))
	d, derr := connect.NewErrorDetail(detail)
	if derr != nil {
		panic(derr)
	}
	err.AddDetail(d)
	return err
}

func TestCompleteAddsTheReasonOfTheCode(t *testing.T) {
	err := connect.NewError(connect.CodeNotFound, errors.New("workspace ws_1 not found"))
	err.Meta().Set("X-Request-Id", "r1")
	got := Complete(fmt.Errorf("wrapped: %w", err))
	if d := detailOf(t, got); d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND {
		t.Errorf("reason %v, want NOT_FOUND", d.GetReason())
	}
	var ce *connect.Error
	errors.As(got, &ce)
	if ce.Code() != connect.CodeNotFound || ce.Message() != "workspace ws_1 not found" || ce.Meta().Get("X-Request-Id") != "r1" {
		t.Errorf("completed error %v (meta %v) lost its code, message or metadata", ce, ce.Meta())
	}
}

func TestCompleteKeepsTheStageAndOtherDetails(t *testing.T) {
	err := withDetail(connect.CodeInvalidArgument, &ctrlv1.ErrorDetail{Stage: ctrlv1.FailureStage_FAILURE_STAGE_READING_FILE})
	other, _ := connect.NewErrorDetail(wrapperspb.String("more"))
	err.AddDetail(other)
	got := Complete(err)
	d := detailOf(t, got)
	if d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_INVALID_REQUEST || d.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_READING_FILE {
		t.Errorf("detail %v, want INVALID_REQUEST at READING_FILE", d)
	}
	var ce *connect.Error
	errors.As(got, &ce)
	if n := len(ce.Details()); n != 2 {
		t.Errorf("%d details, want the completed one and the other", n)
	}
}

func TestCompleteLeavesWhatItShould(t *testing.T) {
	named := withDetail(connect.CodeUnavailable, &ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED})
	precondition := connect.NewError(connect.CodeFailedPrecondition, errors.New("workspace is STOPPED"))
	plain := errors.New("not a Connect error")
	for name, err := range map[string]error{"a named reason": named, "failed_precondition": precondition, "a plain error": plain} {
		if got := Complete(err); got != err {
			t.Errorf("%s: Complete returned %v, want the error unchanged", name, got)
		}
	}
	if Complete(nil) != nil {
		t.Error("Complete(nil) is not nil")
	}
}
