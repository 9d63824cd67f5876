package sdk

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// Screenshot captures the whole screen of a Workspace whose template
// carries a display (such as the built-in desktop): PNG bytes with the
// screen's width and height. Without a display it is
// CodeFailedPrecondition.
func (w *Workspace) Screenshot(ctx context.Context) (*datav1.CaptureScreenResponse, error) {
	return unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.CaptureScreenRequest]) (*connect.Response[datav1.CaptureScreenResponse], error) {
		return d.screen.CaptureScreen
	}, &datav1.CaptureScreenRequest{})
}

// Input delivers keyboard and pointer events to the Workspace's display in
// order, as one batch (at most 1000 events), and returns once the display
// has processed them; a bad event is CodeInvalidArgument and nothing of the
// batch is delivered. Build events with Key, KeyDown, KeyUp, Chord, Type,
// MoveTo, Button, ButtonDown, ButtonUp and Scroll:
//
//	ws.Input(ctx, sdk.MoveTo(100, 200), sdk.Button(1), sdk.Type("hello"), sdk.Key("Return"))
func (w *Workspace) Input(ctx context.Context, events ...*datav1.InputEvent) error {
	_, err := unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.DeliverInputRequest]) (*connect.Response[datav1.DeliverInputResponse], error) {
		return d.input.DeliverInput
	}, &datav1.DeliverInputRequest{Events: events})
	return err
}

// Key is one keystroke (press and release) of the key that produces the X
// keysym ("Return", "a", "F5", "Control_L", "é"; see KeyInput).
func Key(keysym string) *datav1.InputEvent { return keyEvent(keysym, nil) }

// KeyDown presses the key of keysym and holds it.
func KeyDown(keysym string) *datav1.InputEvent { return keyEvent(keysym, proto.Bool(true)) }

// KeyUp releases the key of keysym.
func KeyUp(keysym string) *datav1.InputEvent { return keyEvent(keysym, proto.Bool(false)) }

func keyEvent(keysym string, down *bool) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_Key{Key: &datav1.KeyInput{Keysym: keysym, Down: down}}}
}

// Chord holds every key but the last down, strikes the last, then
// releases the others in reverse order: Chord("Control_L", "Alt_L", "t").
func Chord(keysyms ...string) []*datav1.InputEvent {
	if len(keysyms) == 0 {
		return nil
	}
	held := keysyms[:len(keysyms)-1]
	var out []*datav1.InputEvent
	for _, k := range held {
		out = append(out, KeyDown(k))
	}
	out = append(out, Key(keysyms[len(keysyms)-1]))
	for i := len(held) - 1; i >= 0; i-- {
		out = append(out, KeyUp(held[i]))
	}
	return out
}

// Type types text, one keystroke per character ("\n" is Return, "\t" Tab).
func Type(text string) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_Text{Text: &datav1.TextInput{Text: text}}}
}

// MoveTo moves the pointer to x, y (pixels from the top-left corner).
func MoveTo(x, y uint32) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_PointerMove{PointerMove: &datav1.PointerMoveInput{X: x, Y: y}}}
}

// Button clicks a pointer button (1 left, 2 middle, 3 right) where the
// pointer is.
func Button(button uint32) *datav1.InputEvent { return buttonEvent(button, nil) }

// ButtonDown presses a pointer button and holds it (to drag, say).
func ButtonDown(button uint32) *datav1.InputEvent { return buttonEvent(button, proto.Bool(true)) }

// ButtonUp releases a pointer button.
func ButtonUp(button uint32) *datav1.InputEvent { return buttonEvent(button, proto.Bool(false)) }

func buttonEvent(button uint32, down *bool) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_Button{Button: &datav1.ButtonInput{Button: button, Down: down}}}
}

// Scroll scrolls where the pointer is by steps of the wheel: dy down when
// positive, up when negative; dx right or left.
func Scroll(dx, dy int32) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_Scroll{Scroll: &datav1.ScrollInput{Dx: dx, Dy: dy}}}
}
