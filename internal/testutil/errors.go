package testutil

import (
	"errors"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// WantCode fails t unless err carries code; name says which call it was.
func WantCode(t testing.TB, name string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Errorf("%s: %v, want %v", name, err, code)
	}
}

// ErrorDetail returns the ErrorDetail a Connect error carries; nil when
// it carries none.
func ErrorDetail(err error) *ctrlv1.ErrorDetail {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
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
