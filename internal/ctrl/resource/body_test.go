package resource

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

type book struct {
	Attempt int `json:"attempt"`
}

// TestBodyRoundTrip: a body reads back as written, a body written with
// the message before the bookkeeping reads the same, and a damaged one is
// an error naming the resource; bodies keep the bytes they always had.
func TestBodyRoundTrip(t *testing.T) {
	v := &ctrlv1.Volume{VolumeId: "vol_a", Labels: map[string]string{"k": "v"}}
	body, err := EncodeBody("volume", v, book{Attempt: 3})
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := proto.MarshalOptions{Deterministic: true}.Marshal(v)
	// Bodies stored before were JSON objects of Go maps: the bytes stay
	// the same, whichever of the two names sorts first.
	for _, kind := range []string{"volume", "a"} {
		fromMap, _ := json.Marshal(map[string]any{kind: msg, "book": book{Attempt: 3}})
		if got, err := EncodeBody(kind, v, book{Attempt: 3}); err != nil || string(got) != string(fromMap) {
			t.Errorf("EncodeBody(%s) = %s, %v; want %s", kind, got, err, fromMap)
		}
	}
	ordered, _ := json.Marshal(struct {
		Volume []byte `json:"volume"`
		Book   book   `json:"book"`
	}{msg, book{Attempt: 3}})
	for _, b := range [][]byte{body, ordered} {
		got, gotBook := new(ctrlv1.Volume), book{}
		if err := DecodeBody("volume", "vol_a", b, got, &gotBook); err != nil || !proto.Equal(got, v) || gotBook.Attempt != 3 {
			t.Errorf("DecodeBody(%s) = %v, %+v, %v", b, got, gotBook, err)
		}
	}
	if err := DecodeBody("volume", "vol_a", []byte(`{"volume":"!"`), new(ctrlv1.Volume), new(book)); err == nil || !strings.HasPrefix(err.Error(), "volume vol_a: ") {
		t.Errorf("damaged body: %v", err)
	}
}

// BenchmarkBody encodes and decodes a body the size of a workspace's.
func BenchmarkBody(b *testing.B) {
	type bigBook struct {
		Desired string   `json:"desired"`
		Target  uint64   `json:"target"`
		Layers  []string `json:"layers"`
		Key     []byte   `json:"key"`
	}
	v := &ctrlv1.Volume{VolumeId: "vol_a", Labels: map[string]string{"k": "v"}, Annotations: map[string]string{"note": strings.Repeat("x", 200)}}
	bk := bigBook{Desired: "running", Target: 3, Layers: []string{strings.Repeat("a", 64), strings.Repeat("b", 64)}, Key: make([]byte, 32)}
	body, err := EncodeBody("volume", v, bk)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := EncodeBody("volume", v, bk); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Decode", func(b *testing.B) {
		for b.Loop() {
			var got bigBook
			if err := DecodeBody("volume", "vol_a", body, new(ctrlv1.Volume), &got); err != nil {
				b.Fatal(err)
			}
		}
	})
}
