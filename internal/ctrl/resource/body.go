package resource

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sync"

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
	e := envelopeOf(kind, reflect.TypeOf(book))
	v := reflect.New(e.typ).Elem()
	v.Field(e.msg).SetBytes(msg)
	v.Field(e.book).Set(reflect.ValueOf(book))
	return json.Marshal(v.Addr().Interface())
}

// DecodeBody reads a body EncodeBody wrote into m and book (a pointer); an
// error names the resource.
func DecodeBody(kind, id string, body []byte, m proto.Message, book any) error {
	into := reflect.ValueOf(book).Elem()
	e := envelopeOf(kind, into.Type())
	v := reflect.New(e.typ)
	err := json.Unmarshal(body, v.Interface())
	if err == nil {
		into.Set(v.Elem().Field(e.book))
		err = proto.Unmarshal(v.Elem().Field(e.msg).Bytes(), m)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, id, err)
	}
	return nil
}

// envelope is the struct a body of one kind and bookkeeping type is
// encoded from and decoded into, in one pass of encoding/json: the
// message (base64 in JSON) under the kind's name, the bookkeeping under
// "book", in the order of their names, as JSON objects of Go maps have
// them (bodies were written from maps before).
type envelope struct {
	typ       reflect.Type
	msg, book int // field indexes
}

type envelopeKey struct {
	kind string
	book reflect.Type
}

var envelopes sync.Map // envelopeKey → envelope

func envelopeOf(kind string, book reflect.Type) envelope {
	key := envelopeKey{kind, book}
	if e, ok := envelopes.Load(key); ok {
		return e.(envelope)
	}
	fields := []reflect.StructField{
		{Name: "Msg", Type: reflect.TypeFor[[]byte](), Tag: reflect.StructTag(`json:"` + kind + `"`)},
		{Name: "Book", Type: book, Tag: `json:"book"`},
	}
	e := envelope{msg: 0, book: 1}
	if "book" < kind {
		fields[0], fields[1] = fields[1], fields[0]
		e.msg, e.book = 1, 0
	}
	e.typ = reflect.StructOf(fields)
	envelopes.Store(key, e)
	return e
}
