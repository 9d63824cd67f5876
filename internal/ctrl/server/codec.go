package server

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// deterministicCodec is Connect's binary protobuf codec with deterministic
// marshaling (map entries in key order), so that a replayed command
// returns the same bytes as the first response. It decodes no request
// that holds more than maxElements elements (see countElements).
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
	return proto.Unmarshal(data, m)
}

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
// parse is left to proto.Unmarshal to refuse.
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
