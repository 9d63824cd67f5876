package server

import (
	"fmt"

	"google.golang.org/protobuf/proto"
)

// deterministicCodec is Connect's binary protobuf codec with deterministic
// marshaling (map entries in key order), so that a replayed command
// returns the same bytes as the first response.
type deterministicCodec struct{}

var deterministic = proto.MarshalOptions{Deterministic: true}

func (deterministicCodec) Name() string { return "proto" }

func (deterministicCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal: %T is not a proto.Message", v)
	}
	return deterministic.Marshal(m)
}

func (deterministicCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal: %T is not a proto.Message", v)
	}
	return proto.Unmarshal(data, m)
}
