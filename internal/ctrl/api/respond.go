// What every handler shares: turning a result into a response, with one
// mapping of errors, and describing a write request to the command layer.

package api

import (
	"errors"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/accesslog"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
)

// Respond wraps a result. Canonical Connect errors pass through; any other
// error is reported as internal without its text, which may name database
// or file system details: the access log's interceptor logs it with the
// request id it gives the caller, or answers it as every call does when it
// is one all calls share (the database down or full, the caller gone).
func Respond[R any](msg *R, err error) (*connect.Response[R], error) {
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		return nil, accesslog.Internal(err)
	}
	return connect.NewResponse(msg), nil
}

// Mutation describes a write request for the command layer: the whole
// request message is the command's input.
func Mutation[R proto.Message, Q any, PQ interface {
	*Q
	proto.Message
}](req *connect.Request[Q], cmd *ctrlv1.CommandMetadata) resource.Mutation[R] {
	return resource.Mutation[R]{Method: req.Spec().Procedure, Command: cmd, Input: PQ(req.Msg), New: resource.NewMessage[R]}
}

// receiver returns the next message of a client stream on each call, and
// io.EOF once the client closed its side.
func receiver[T any](stream interface {
	Receive() bool
	Msg() *T
	Err() error
}) func() (*T, error) {
	return func() (*T, error) {
		if stream.Receive() {
			return stream.Msg(), nil
		}
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
}
