package ctrltest

import (
	"encoding/json"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
)

// requestErrors maps each Connect code that blames the request to the
// HTTP status the Connect protocol answers a unary call with.
var requestErrors = map[connect.Code]int{
	connect.CodeInvalidArgument:    http.StatusBadRequest,
	connect.CodeFailedPrecondition: http.StatusBadRequest,
	connect.CodeOutOfRange:         http.StatusBadRequest,
	connect.CodeUnauthenticated:    http.StatusUnauthorized,
	connect.CodePermissionDenied:   http.StatusForbidden,
	connect.CodeNotFound:           http.StatusNotFound,
	connect.CodeAlreadyExists:      http.StatusConflict,
	connect.CodeAborted:            http.StatusConflict,
	connect.CodeResourceExhausted:  http.StatusTooManyRequests,
	connect.CodeCanceled:           499,
	connect.CodeDeadlineExceeded:   http.StatusGatewayTimeout,
	connect.CodeUnimplemented:      http.StatusNotImplemented,
	connect.CodeUnavailable:        http.StatusServiceUnavailable,
	connect.CodeInternal:           http.StatusInternalServerError,
	connect.CodeUnknown:            http.StatusInternalServerError,
	connect.CodeDataLoss:           http.StatusInternalServerError,
}

// RequestError reports whether code blames the request (the 4xx class):
// the answer a bad request must get.
func RequestError(code connect.Code) bool {
	status, ok := requestErrors[code]
	return ok && status >= 400 && status < 500 && code != connect.CodeCanceled
}

// CheckUnaryRefusal checks the answer to a bad unary request under the
// Connect protocol: a Connect error whose code blames the request, with
// the HTTP status the protocol gives that code, or the protocol's own
// refusals of a request it cannot read (415 for a content type it does not
// serve, 405 for a method other than POST or GET). It returns the code, or
// "" for a protocol refusal.
func CheckUnaryRefusal(status int, body []byte) (string, error) {
	if status == http.StatusUnsupportedMediaType || status == http.StatusMethodNotAllowed {
		return "", nil
	}
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return "", fmt.Errorf("HTTP %d with a body that is no Connect error: %q", status, clip(body))
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.Code)); err != nil {
		return e.Code, fmt.Errorf("HTTP %d with unknown code %q: %s", status, e.Code, e.Message)
	}
	if !RequestError(code) {
		return e.Code, fmt.Errorf("HTTP %d %s: %s; want an error of the request", status, code, e.Message)
	}
	if want := requestErrors[code]; status != want {
		return e.Code, fmt.Errorf("HTTP %d for %s, want %d", status, code, want)
	}
	return e.Code, nil
}

func clip(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}
