package sdk

import (
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
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

// TestScreenAndInputWithoutDisplay: a Workspace of base has no display;
// the data plane says so through the SDK's errors.
func TestScreenAndInputWithoutDisplay(t *testing.T) {
	ws := newWorkspace(t)
	_, err := ws.Screenshot(t.Context())
	if f, _ := FailureOf(err); connect.CodeOf(err) != connect.CodeFailedPrecondition || f.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_CAPTURING_SCREEN {
		t.Errorf("Screenshot: %v, want failed_precondition at CAPTURING_SCREEN", err)
	}
	err = ws.Input(t.Context(), MoveTo(1, 1), Button(1), Type("x"), Scroll(0, 1))
	if f, _ := FailureOf(err); connect.CodeOf(err) != connect.CodeFailedPrecondition || f.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_DELIVERING_INPUT {
		t.Errorf("Input: %v, want failed_precondition at DELIVERING_INPUT", err)
	}
}
