// Package errdetail gives every refusal of the API a FailureReason:
// ErrorDetail.reason is what callers switch on, and a Connect code alone
// says the same thing less precisely. Errors that name a reason of their
// own (CAPABILITY_UNAVAILABLE, VOLUME_LOST, …) keep it; the rest get the
// reason their code implies.
package errdetail

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/sdk/failure"
)

// Complete returns err with the reason its code implies when no
// ErrorDetail of it names one: set in its first ErrorDetail, or in a new
// one. Any other error is returned as it is.
func Complete(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	reason := failure.ReasonOf(ce.Code())
	if reason == ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		return err
	}
	var detail *ctrlv1.ErrorDetail
	var others []*connect.ErrorDetail
	for _, d := range ce.Details() {
		v, verr := d.Value()
		if ed, ok := v.(*ctrlv1.ErrorDetail); ok && verr == nil && detail == nil {
			if ed.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
				return err
			}
			detail = ed
			continue
		}
		others = append(others, d)
	}
	if detail == nil {
		detail = &ctrlv1.ErrorDetail{}
	}
	detail.Reason = reason
	d, derr := connect.NewErrorDetail(detail)
	if derr != nil {
		return err
	}
	// A Connect error's details can be added to, not replaced: the
	// completed error is a copy with the same code, message and metadata.
	out := connect.NewError(ce.Code(), errors.New(ce.Message()))
	for k, vs := range ce.Meta() {
		out.Meta()[k] = vs
	}
	out.AddDetail(d)
	for _, o := range others {
		out.AddDetail(o)
	}
	return out
}

// Interceptor completes the error of every call a handler answers.
func Interceptor() connect.Interceptor { return interceptor{} }

type interceptor struct{}

func (interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, Complete(err)
	}
}

func (interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return Complete(next(ctx, conn))
	}
}
