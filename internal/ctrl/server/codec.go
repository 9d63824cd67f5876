package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// codecs are the binary and JSON codecs, under every name Connect gives
// them, each decoding no request of more than maxElements elements.
func codecs(maxElements int) connect.HandlerOption {
	return connect.WithHandlerOptions(
		connect.WithCodec(deterministicCodec{maxElements: maxElements}),
		connect.WithCodec(jsonCodec{name: "json", maxElements: maxElements}),
		connect.WithCodec(jsonCodec{name: "json; charset=utf-8", maxElements: maxElements}))
}

// deterministicCodec is Connect's binary protobuf codec with deterministic
// marshaling (map entries in key order), so that a replayed command
// returns the same bytes as the first response. It decodes no request
// that holds more than maxElements elements (see countElements), and drops
// the fields a request holds that the schema does not define: they would
// otherwise be stored with what they came in, returned by reads, read as
// a value never checked once a later schema names their number, and make
// an update of equal content a change.
type deterministicCodec struct{ maxElements int }

var deterministic = proto.MarshalOptions{Deterministic: true}

func (deterministicCodec) Name() string { return "proto" }

func (deterministicCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal: %T is not a proto.Message", v)
	}
	return deterministic.Marshal(m)
}

func (c deterministicCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal: %T is not a proto.Message", v)
	}
	budget := c.maxElements
	if err := countElements(data, m.ProtoReflect().Descriptor(), &budget, 0); err != nil {
		if errors.Is(err, errTooManyElements) {
			return fmt.Errorf("the request holds more than %d elements (messages, map entries and repeated values), the most a request may", c.maxElements)
		}
		return err
	}
	return dropUnknown.Unmarshal(data, m)
}

var dropUnknown = proto.UnmarshalOptions{DiscardUnknown: true}

// maxRequestElements bounds the elements of a request message: each
// message, map entry and repeated value is an allocation of tens of bytes
// or more when decoded, from as little as 2 bytes of the request (8 MiB of
// empty messages took about 700 MB). The largest request the reference
// admits, 256 KiB of annotations in the shortest distinct keys, holds
// fewer than 100,000. A host agent's report holds some tens a workspace:
// the host API admits maxHostRequestElements.
const (
	maxRequestElements     = 1 << 18
	maxHostRequestElements = 1 << 22
)

// maxRequestDepth bounds how deeply a request's messages nest; the
// reference's nest a few levels.
const maxRequestDepth = 64

var (
	errTooManyElements = errors.New("too many elements")
	errTooDeep         = fmt.Errorf("the request nests messages more than %d deep", maxRequestDepth)
)

// countElements takes from budget the elements of b, an encoding of a
// message of md: every message and map entry, and every value of a
// repeated field (a packed run counts a value per byte). It fails once
// the budget runs out, before the message is decoded; what it cannot
// parse is left to the decoder to refuse.
func countElements(b []byte, md protoreflect.MessageDescriptor, budget *int, depth int) error {
	if depth > maxRequestDepth {
		return errTooDeep
	}
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		fd := fields.ByNumber(num)
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil
			}
			b = b[n:]
			if fd != nil && fd.IsList() {
				*budget--
			}
		} else {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil
			}
			b = b[n:]
			switch {
			case fd == nil: // unknown: kept as its bytes
			case fd.Message() != nil: // a message, a map entry or a list's element
				*budget--
				if err := countElements(v, fd.Message(), budget, depth+1); err != nil {
					return err
				}
			case fd.IsList() && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind:
				*budget -= len(v) // packed
			case fd.IsList():
				*budget--
			}
		}
		if *budget < 0 {
			return errTooManyElements
		}
	}
	return nil
}

// jsonCodec is Connect's JSON codec with the element bound of
// deterministicCodec, decoding as the standard proto3 JSON mapping says a
// parser does by default: a field or an enum value name the schema does
// not define is refused, not dropped (a misspelled field would otherwise be
// ignored, and an unknown enum name read as its zero value, which often
// means the default the caller did not ask for). protojson decodes each
// object, array value and map entry into an allocation of tens of bytes
// or more, from as little as 3 bytes of the request ("{},"). It counts the
// message it is given, decompressed and out of its envelope.
type jsonCodec struct {
	name        string
	maxElements int
}

func (c jsonCodec) Name() string { return c.name }

func (c jsonCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal: %T is not a proto.Message", v)
	}
	return protojson.MarshalOptions{}.Marshal(m)
}

func (c jsonCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal: %T is not a proto.Message", v)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if jsonElements(data) > c.maxElements {
		return fmt.Errorf("the request holds more than %d elements (objects, array values and members), the most a request may", c.maxElements)
	}
	if err := protojson.Unmarshal(data, m); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", v, err)
	}
	return nil
}

// MarshalStable and IsBinary are what Connect asks of a codec for
// requests sent with GET, as its own JSON codec answers them.
func (c jsonCodec) MarshalStable(v any) ([]byte, error) {
	b, err := c.Marshal(v)
	if err != nil {
		return nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return nil, err
	}
	return compact.Bytes(), nil
}

func (c jsonCodec) IsBinary() bool { return false }

// jsonElements counts, outside strings, the characters that open an
// object or an array or separate their members ('{', '[', ','): every
// element protojson decodes costs one of them.
func jsonElements(b []byte) int {
	n := 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString:
			switch c {
			case '\\':
				escaped = true
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[' || c == ',':
			n++
		}
	}
	return n
}
