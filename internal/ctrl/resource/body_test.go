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
// an error naming the resource.
func TestBodyRoundTrip(t *testing.T) {
	v := &ctrlv1.Volume{VolumeId: "vol_a", Labels: map[string]string{"k": "v"}}
	body, err := EncodeBody("volume", v, book{Attempt: 3})
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := proto.MarshalOptions{Deterministic: true}.Marshal(v)
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
