package agent

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/iotest"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// message is one length-prefixed message of flags and payload.
func message(flags byte, payload string) []byte {
	b := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

// TestMessageStreamEndsBetweenMessages: a Connect stream whose guest goes
// away between two messages ends with an "unavailable" end-of-stream
// message after what was sent, read in any pieces; one that breaks inside
// a message keeps its error; one that ends well is untouched.
func TestMessageStreamEndsBetweenMessages(t *testing.T) {
	sent := append(message(0, "first"), message(0, "")...)
	sent = append(sent, message(0, "third")...)
	lost := errors.New("http2: client connection lost")
	body := func(data []byte, err error) *http.Response {
		res := &http.Response{Header: http.Header{"Content-Type": {"application/connect+proto"}},
			Body: io.NopCloser(io.MultiReader(iotest.OneByteReader(bytes.NewReader(data)), iotest.ErrReader(err)))}
		endsStreamCleanly(res)
		return res
	}

	got, err := io.ReadAll(body(sent, lost).Body)
	if want := append(bytes.Clone(sent), connectEnd(wentAway())...); err != nil || !bytes.Equal(got, want) {
		t.Errorf("broken between messages: %q, %v; want %q", got, err, want)
	}
	if _, err := io.ReadAll(body(sent[:len(sent)-2], lost).Body); !errors.Is(err, lost) {
		t.Errorf("broken inside a message: %v; want the break", err)
	}
	if got, err := io.ReadAll(body(sent, io.EOF).Body); err != nil || !bytes.Equal(got, sent) {
		t.Errorf("an intact stream: %q, %v", got, err)
	}

	grpc := &http.Response{Header: http.Header{"Content-Type": {"application/grpc"}}, Trailer: http.Header{"Grpc-Status": nil},
		Body: io.NopCloser(io.MultiReader(bytes.NewReader(message(0, "m")), iotest.ErrReader(lost)))}
	endsStreamCleanly(grpc)
	if got, err := io.ReadAll(grpc.Body); err != nil || !bytes.Equal(got, message(0, "m")) || grpc.Trailer.Get("Grpc-Status") != "14" {
		t.Errorf("gRPC broken between messages: %q, %v, trailer %v", got, err, grpc.Trailer)
	}
	b, _ := base64.RawStdEncoding.DecodeString(grpc.Trailer.Get("Grpc-Status-Details-Bin"))
	var st status.Status
	var detail ctrlv1.ErrorDetail
	if err := proto.Unmarshal(b, &st); err != nil || st.Code != 14 || len(st.Details) != 1 || st.Details[0].UnmarshalTo(&detail) != nil ||
		detail.Reason != ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE {
		t.Errorf("gRPC status details: %v (%v), detail %v", &st, err, &detail)
	}
}
