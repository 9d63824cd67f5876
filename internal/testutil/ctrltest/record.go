package ctrltest

import (
	"bytes"
	"encoding/binary"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/kibotos/kibotos/internal/ctrl/server"
)

// Call is one call the server was sent.
type Call struct {
	// Procedure is the request's path, /package.Service/Method.
	Procedure string
	// Method is the procedure's last element.
	Method string
	// Authorization is the request's Authorization header.
	Authorization string
	// Requests are the request messages the server decoded from the
	// body: one for a unary call, one for each message of a client
	// stream that the handler read. Bytes that do not decode add none.
	Requests []proto.Message
}

// recorder records each call, then hands it to next unchanged.
type recorder struct {
	next  http.Handler
	mu    sync.Mutex
	calls []*Call
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	c := &Call{Procedure: req.URL.Path, Authorization: req.Header.Get("Authorization")}
	c.Method = c.Procedure[strings.LastIndex(c.Procedure, "/")+1:]
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()

	input := inputType(c.Procedure)
	mediaType, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	// Bodies larger than the server reads are left to the server alone.
	if input == nil || req.Header.Get("Content-Encoding") != "" || req.Method != http.MethodPost || req.ContentLength > server.MaxRequestBytes {
		r.next.ServeHTTP(w, req)
		return
	}
	decode := func(b []byte) {
		m := input.New().Interface()
		var err error
		if strings.HasSuffix(mediaType, "json") {
			err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
		} else {
			err = proto.Unmarshal(b, m)
		}
		if err == nil {
			r.mu.Lock()
			c.Requests = append(c.Requests, m)
			r.mu.Unlock()
		}
	}
	switch mediaType {
	case "application/proto", "application/json":
		// A unary body is whole before the handler answers.
		body, err := io.ReadAll(req.Body)
		if err == nil {
			decode(body)
		}
		req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
	case "application/connect+proto", "application/connect+json", "application/grpc", "application/grpc+proto":
		// A stream's messages are recorded as the handler reads them.
		req.Body = &envelopeTee{body: req.Body, decode: decode}
	}
	r.next.ServeHTTP(w, req)
}

func (r *recorder) all() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Call, len(r.calls))
	for i, c := range r.calls {
		out[i] = *c
		out[i].Requests = append([]proto.Message(nil), c.Requests...)
	}
	return out
}

// inputType returns the request type of a procedure of the API, or nil.
func inputType(procedure string) protoreflect.MessageType {
	service, method, ok := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
	if !ok {
		return nil
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if err != nil {
		return nil
	}
	return mt
}

// errReader returns err, or io.EOF for nil.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

// envelopeTee passes a streaming body through and decodes each enveloped
// message (a flags byte, a 4-byte big-endian length, the message) that
// goes by, skipping compressed messages and end-of-stream frames.
type envelopeTee struct {
	body   io.ReadCloser
	decode func([]byte)
	buf    []byte
}

func (e *envelopeTee) Read(p []byte) (int, error) {
	n, err := e.body.Read(p)
	e.buf = append(e.buf, p[:n]...)
	for len(e.buf) >= 5 {
		size := binary.BigEndian.Uint32(e.buf[1:5])
		if uint64(len(e.buf)-5) < uint64(size) {
			break
		}
		if flags := e.buf[0]; flags == 0 {
			e.decode(e.buf[5 : 5+size])
		}
		e.buf = e.buf[5+size:]
	}
	return n, err
}

func (e *envelopeTee) Close() error { return e.body.Close() }
