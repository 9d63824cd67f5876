package sdk

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// cutAsUnavailable is an http.RoundTripper whose response bodies report a
// connection that broke in the middle of a response, as when the server's
// process dies or restarts, as a *connect.Error with CodeUnavailable. Left
// alone, Connect reads such a cut stream as a malformed message
// (invalid_argument: protocol error), which callers must not retry; the
// call did not fail for its input, and retrying it once the server is back
// is the cure.
type cutAsUnavailable struct {
	base http.RoundTripper
}

func (t cutAsUnavailable) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &cutBody{ReadCloser: resp.Body, req: r}
	return resp, nil
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach base.
func (t cutAsUnavailable) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// cutBody is a response body that turns a broken connection into
// CodeUnavailable.
type cutBody struct {
	io.ReadCloser
	req *http.Request
}

func (b *cutBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && connectionCut(err) && b.req.Context().Err() == nil {
		err = connect.NewError(connect.CodeUnavailable, fmt.Errorf("the connection to the server broke during the call; retry: %w", err))
	}
	return n, err
}

// connectionCut reports whether err, from reading a response body, means
// the connection under it broke: it ended early, was reset, or the HTTP/2
// connection was lost or shut. A reset of only the stream (RST_STREAM) is
// the server's answer and stays for Connect to read.
func connectionCut(err error) bool {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "client connection lost") || strings.Contains(msg, "server sent GOAWAY")
}
