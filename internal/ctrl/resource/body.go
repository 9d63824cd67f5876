package resource

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// EncodeBody serializes the stored body of a resource of a kind (such as
// "volume"): a JSON object holding its API message m as deterministic
// protobuf under the kind's name, and under "book" the bookkeeping the
// control plane keeps beside it.
func EncodeBody(kind string, m proto.Message, book any) ([]byte, error) {
	msg, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{kind: msg, "book": book})
}

// DecodeBody reads a body EncodeBody wrote into m and book (a pointer); an
// error names the resource.
func DecodeBody(kind, id string, body []byte, m proto.Message, book any) error {
	var env map[string]json.RawMessage
	var msg []byte
	err := json.Unmarshal(body, &env)
	if b := env["book"]; err == nil && b != nil {
		err = json.Unmarshal(b, book)
	}
	if k := env[kind]; err == nil && k != nil {
		err = json.Unmarshal(k, &msg)
	}
	if err == nil {
		err = proto.Unmarshal(msg, m)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, id, err)
	}
	return nil
}
