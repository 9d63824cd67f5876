package agent

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// guestWentAway is what a caller is told of a stream whose guest agent
// went away in the middle of it, with the reason UNAVAILABLE.
const guestWentAway = "the workspace's guest agent went away during the call: the workspace was stopped, restarted or deleted"

// wentAway is the error of guestWentAway, with the reason UNAVAILABLE.
func wentAway() *connect.Error {
	err := connect.NewError(connect.CodeUnavailable, errors.New(guestWentAway))
	if d, derr := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// endsStreamCleanly makes a streaming response whose guest goes away in
// the middle of it (a forced stop kills the guest agent with its
// processes) end with a Connect or gRPC error "unavailable" between two
// messages, as a server that fails does, instead of a stream reset that
// callers see as "internal"; a stream the gateway cut (its session
// revoked, say: cutKey) ends with that refusal. A break inside a message
// cannot be mended: the caller still sees the reset.
func endsStreamCleanly(res *http.Response) {
	cause := func() *connect.Error {
		if res.Request != nil {
			if cut, ok := res.Request.Context().Value(cutKey{}).(*atomic.Pointer[connect.Error]); ok && cut.Load() != nil {
				return cut.Load()
			}
		}
		return wentAway()
	}
	ct := res.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/connect+"):
		res.Body = &messageStream{ReadCloser: res.Body, messages: recordFollower{format: connectEnvelopes}, end: func() []byte { return connectEnd(cause()) }}
	case ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+"):
		res.Body = &messageStream{ReadCloser: res.Body, messages: recordFollower{format: connectEnvelopes}, end: func() []byte {
			// The proxy sends the trailers it was announced once the body
			// ends; gRPC announces these.
			if res.Trailer == nil {
				res.Trailer = http.Header{}
			}
			grpcEnd(res.Trailer, cause())
			return nil
		}}
	}
}

// connectEnd is the Connect end-of-stream message of the error.
func connectEnd(e *connect.Error) []byte {
	var details []map[string]string
	for _, d := range e.Details() {
		details = append(details, map[string]string{"type": d.Type(), "value": base64.RawStdEncoding.EncodeToString(d.Bytes())})
	}
	payload, _ := json.Marshal(map[string]any{"error": map[string]any{"code": e.Code().String(), "message": e.Message(), "details": details}})
	msg := make([]byte, 5, 5+len(payload))
	msg[0] = 0x02 // end of stream
	binary.BigEndian.PutUint32(msg[1:], uint32(len(payload)))
	return append(msg, payload...)
}

// grpcEnd sets the gRPC trailers of the error.
func grpcEnd(trailer http.Header, e *connect.Error) {
	trailer.Set("Grpc-Status", strconv.Itoa(int(e.Code())))
	trailer.Set("Grpc-Message", url.PathEscape(e.Message()))
	st := &status.Status{Code: int32(e.Code()), Message: e.Message()}
	for _, d := range e.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	if b, err := proto.Marshal(st); err == nil {
		trailer.Set("Grpc-Status-Details-Bin", base64.RawStdEncoding.EncodeToString(b))
	}
}

// messageStream is a response body of length-prefixed messages (a flag
// byte and a 4-byte big-endian length, then the message: Connect's and
// gRPC's streams) that follows where each message ends, so that a read
// error between two messages ends the body with end's bytes.
type messageStream struct {
	io.ReadCloser
	end      func() []byte
	messages recordFollower // of connectEnvelopes
	// ending is what is left to send of the end, once it began.
	ending []byte
	ended  bool
}

func (s *messageStream) Read(p []byte) (int, error) {
	if s.ended {
		if len(s.ending) == 0 {
			return 0, io.EOF
		}
		n := copy(p, s.ending)
		s.ending = s.ending[n:]
		return n, nil
	}
	n, err := s.ReadCloser.Read(p)
	s.messages.follow(p[:n], nil)
	if err != nil && !errors.Is(err, io.EOF) && s.messages.between() {
		s.ended, s.ending = true, s.end()
		if n > 0 || len(s.ending) > 0 {
			return n, nil
		}
		return 0, io.EOF
	}
	return n, err
}
