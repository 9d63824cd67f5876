package ctrltest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// BadRequest is one malformed call of a method, as raw HTTP.
type BadRequest struct {
	// Name says what is wrong with it.
	Name        string
	ContentType string
	Body        []byte
	// Token replaces the caller's valid bearer token when set; "-" sends
	// no Authorization header.
	Token string
	// LibraryCode, when set, is the code connect-go itself ends the
	// stream with, before any interceptor or handler runs; Send accepts
	// it (it is no error of the request's class).
	LibraryCode connect.Code
}

// oversize is one byte more than the server reads of a message.
const oversize = 8<<20 + 1

// BadRequests returns the malformed calls of method md: a content type it
// does not serve, garbage, truncated and oversized bodies, JSON that is no
// message, every string field huge, every enum field an unknown value, and
// missing or wrong tokens. Streaming methods get them in the Connect
// streaming protocol's envelopes, and a stream closed before its first
// message.
func BadRequests(md protoreflect.MethodDescriptor) []BadRequest {
	in := newMessage(md.Input())
	streaming := md.IsStreamingClient() || md.IsStreamingServer()
	protoType, jsonType := "application/proto", "application/json"
	wrap := func(b []byte) []byte { return b }
	if streaming {
		protoType, jsonType = "application/connect+proto", "application/connect+json"
		wrap = func(b []byte) []byte { return envelope(0, uint32(len(b)), b) }
	}
	full := fill(in)
	valid, _ := proto.MarshalOptions{Deterministic: true}.Marshal(full)

	reqs := []BadRequest{
		{Name: "wrong content type", ContentType: "text/plain", Body: []byte("hello")},
		{Name: "garbage", ContentType: protoType, Body: wrap([]byte("\xff\xff\xff\xff\x0f\x01garbage"))},
		{Name: "garbage json", ContentType: jsonType, Body: wrap([]byte(`{"`))},
		{Name: "json of another shape", ContentType: jsonType, Body: wrap([]byte(`[1,{"a":null},"x"]`))},
		{Name: "oversized", ContentType: protoType, Body: wrap(bytes.Repeat([]byte{0x0a}, oversize))},
		{Name: "no token", ContentType: protoType, Body: wrap(nil), Token: "-"},
		{Name: "wrong token", ContentType: protoType, Body: wrap(nil), Token: "tok_wrong.c2VjcmV0"},
		{Name: "malformed token", ContentType: protoType, Body: wrap(nil), Token: "not a token at all"},
	}
	if len(valid) > 1 {
		reqs = append(reqs, BadRequest{Name: "truncated", ContentType: protoType, Body: wrap(valid[:len(valid)-1])})
	}
	if m, ok := mutate(in, hugeStrings); ok {
		b, _ := proto.Marshal(m)
		reqs = append(reqs, BadRequest{Name: "huge strings", ContentType: protoType, Body: wrap(b)})
	}
	if m, ok := mutate(in, unknownEnums); ok {
		b, _ := proto.Marshal(m)
		reqs = append(reqs, BadRequest{Name: "unknown enum values", ContentType: protoType, Body: wrap(b)})
	}
	if streaming {
		reqs = append(reqs,
			BadRequest{Name: "envelope longer than its body", ContentType: protoType, Body: envelope(0, 1000, []byte("short"))},
			BadRequest{Name: "envelope declaring a huge message", ContentType: protoType, Body: envelope(0, 1<<31, nil)},
			BadRequest{Name: "compressed envelope without an encoding", ContentType: protoType, Body: envelope(1, 3, []byte("abc")),
				LibraryCode: connect.CodeInternal},
		)
		closed := BadRequest{Name: "closed before the first message", ContentType: protoType, Body: nil}
		if !md.IsStreamingClient() {
			closed.LibraryCode = connect.CodeUnimplemented
		}
		reqs = append(reqs, closed)
	}
	return reqs
}

func envelope(flags byte, size uint32, b []byte) []byte {
	out := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], size)
	return append(out, b...)
}

func newMessage(d protoreflect.MessageDescriptor) proto.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
	if err != nil {
		panic(err)
	}
	return mt.New().Interface()
}

// fill returns a copy of m with every scalar field of the top level set,
// so that truncating its encoding cuts a field.
func fill(m proto.Message) proto.Message {
	out := proto.Clone(m)
	r := out.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		if f.IsList() || f.IsMap() || f.ContainingOneof() != nil {
			continue
		}
		switch f.Kind() {
		case protoreflect.StringKind:
			r.Set(f, protoreflect.ValueOfString("x"))
		case protoreflect.BytesKind:
			r.Set(f, protoreflect.ValueOfBytes([]byte("x")))
		case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Uint32Kind, protoreflect.Uint64Kind,
			protoreflect.BoolKind, protoreflect.EnumKind:
			r.Set(f, f.Default())
			if f.Kind() == protoreflect.BoolKind {
				r.Set(f, protoreflect.ValueOfBool(true))
			}
		}
	}
	return out
}

// mutate returns a copy of m changed by change down to three levels of
// nested messages, and whether change found a field to change.
func mutate(m proto.Message, change func(protoreflect.Message, protoreflect.FieldDescriptor) bool) (proto.Message, bool) {
	out := proto.Clone(m)
	return out, walk(out.ProtoReflect(), change, 3)
}

func walk(r protoreflect.Message, change func(protoreflect.Message, protoreflect.FieldDescriptor) bool, depth int) bool {
	changed := false
	fields := r.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		if o := f.ContainingOneof(); o != nil && r.WhichOneof(o) != nil && r.WhichOneof(o) != f {
			continue
		}
		if f.Kind() == protoreflect.MessageKind && !f.IsList() && !f.IsMap() && depth > 0 {
			sub := r.Mutable(f).Message()
			if walk(sub, change, depth-1) {
				changed = true
			} else {
				r.Clear(f)
			}
			continue
		}
		if change(r, f) {
			changed = true
		}
	}
	return changed
}

// hugeStrings sets a string field to 256 KiB, far beyond any name, ID or
// address the API takes.
func hugeStrings(r protoreflect.Message, f protoreflect.FieldDescriptor) bool {
	if f.Kind() != protoreflect.StringKind || f.IsMap() {
		return false
	}
	huge := strings.Repeat("a", 256<<10)
	if f.IsList() {
		r.Mutable(f).List().Append(protoreflect.ValueOfString(huge))
	} else {
		r.Set(f, protoreflect.ValueOfString(huge))
	}
	return true
}

// unknownEnums sets an enum field to a number its enum does not define.
func unknownEnums(r protoreflect.Message, f protoreflect.FieldDescriptor) bool {
	if f.Kind() != protoreflect.EnumKind || f.IsMap() {
		return false
	}
	if f.IsList() {
		r.Mutable(f).List().Append(protoreflect.ValueOfEnum(9999))
	} else {
		r.Set(f, protoreflect.ValueOfEnum(9999))
	}
	return true
}

// Tally counts what Abuse sent: the methods, the bad requests, those
// connect-go answers itself (BadRequest.LibraryCode), and the answers by
// code.
type Tally struct {
	Methods, Sent, Library int
	Codes                  map[string]int
}

func (t Tally) String() string {
	return fmt.Sprintf("%d bad requests to %d methods (%d answered by connect-go itself); answers by code: %v",
		t.Sent, t.Methods, t.Library, t.Codes)
}

// Abuse sends every BadRequest of every method of the services of the
// proto package pkg with send, which returns the answer's code and verdict
// (Send's), hands each verdict to check and counts into tally.
func Abuse(pkg protoreflect.FullName, tally *Tally,
	send func(md protoreflect.MethodDescriptor, procedure string, bad BadRequest) (string, error),
	check func(procedure string, bad BadRequest, err error)) {
	if tally.Codes == nil {
		tally.Codes = map[string]int{}
	}
	protoregistry.GlobalFiles.RangeFilesByPackage(pkg, func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				md := sd.Methods().Get(j)
				procedure := "/" + string(sd.FullName()) + "/" + string(md.Name())
				tally.Methods++
				for _, bad := range BadRequests(md) {
					tally.Sent++
					code, err := send(md, procedure, bad)
					tally.Codes[code]++
					if bad.LibraryCode != 0 {
						tally.Library++
					}
					check(procedure, bad, err)
				}
			}
		}
		return true
	})
}

// Send sends a bad request of procedure to baseURL with token (unless the
// request names its own), bounded by timeout, and checks the answer: a
// canonical Connect error that blames the request. It returns the code
// ("" for a protocol refusal such as 415).
func Send(ctx context.Context, client *http.Client, baseURL, procedure, token string, md protoreflect.MethodDescriptor, b BadRequest, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+procedure, bytes.NewReader(b.Body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", b.ContentType)
	if strings.HasPrefix(b.ContentType, "application/connect+") {
		req.Header.Set("Connect-Protocol-Version", "1")
	}
	switch b.Token {
	case "":
		req.Header.Set("Authorization", "Bearer "+token)
	case "-":
	default:
		req.Header.Set("Authorization", "Bearer "+b.Token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("no answer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !(md.IsStreamingClient() || md.IsStreamingServer()) {
		if resp.StatusCode == http.StatusOK {
			return "", fmt.Errorf("accepted (HTTP 200): %q", clip(body))
		}
		if !(md.IsStreamingClient() || md.IsStreamingServer()) {
			return CheckUnaryRefusal(resp.StatusCode, body)
		}
		if resp.StatusCode >= 500 {
			return "", fmt.Errorf("HTTP %d: %q", resp.StatusCode, clip(body))
		}
		return "", nil
	}
	return checkStreamRefusal(body, b.LibraryCode)
}

// checkStreamRefusal checks a Connect streaming answer: its last envelope
// is the end of the stream, which must carry an error that blames the
// request.
func checkStreamRefusal(body []byte, library connect.Code) (string, error) {
	var end []byte
	for len(body) >= 5 {
		size := binary.BigEndian.Uint32(body[1:5])
		if uint64(len(body)-5) < uint64(size) {
			return "", fmt.Errorf("truncated answer envelope")
		}
		if body[0]&0x02 != 0 {
			end = body[5 : 5+size]
		}
		body = body[5+size:]
	}
	if end == nil {
		return "", fmt.Errorf("stream answer without an end")
	}
	var e struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(end, &e); err != nil {
		return "", fmt.Errorf("end of stream is no JSON: %q", clip(end))
	}
	if e.Error == nil {
		return "", fmt.Errorf("stream ended without an error")
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.Error.Code)); err == nil && library != 0 && code == library {
		return e.Error.Code, nil
	}
	if err := code.UnmarshalText([]byte(e.Error.Code)); err != nil || !RequestError(code) {
		return e.Error.Code, fmt.Errorf("stream ended with %s: %s; want an error of the request", e.Error.Code, e.Error.Message)
	}
	return e.Error.Code, nil
}
