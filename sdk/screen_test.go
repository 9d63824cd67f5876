package sdk

import (
	"testing"

	"google.golang.org/protobuf/proto"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

func TestChord(t *testing.T) {
	got := Chord("Control_L", "Alt_L", "t")
	want := []*datav1.InputEvent{KeyDown("Control_L"), KeyDown("Alt_L"), Key("t"), KeyUp("Alt_L"), KeyUp("Control_L")}
	if len(got) != len(want) {
		t.Fatalf("Chord = %v", got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("event %d = %v, want %v", i, got[i], want[i])
		}
	}
	if Key("a").GetKey().Down != nil || !*KeyDown("a").GetKey().Down || *KeyUp("a").GetKey().Down {
		t.Error("Key, KeyDown, KeyUp set down wrong")
	}
	if Chord() != nil {
		t.Error("an empty chord has events")
	}
}
