package dataplane

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/guest/x11"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

func TestScreenAndInputWithoutDisplay(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 10*time.Second)
	_, err := e.screen.CaptureScreen(ctx, connect.NewRequest(&datav1.CaptureScreenRequest{}))
	wantCode(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureStage_FAILURE_STAGE_CAPTURING_SCREEN)
	if !strings.Contains(err.Error(), "carries no display") {
		t.Errorf("CaptureScreen: %v, want it to say the template carries no display", err)
	}
	_, err = e.input.DeliverInput(ctx, connect.NewRequest(&datav1.DeliverInputRequest{Events: []*datav1.InputEvent{
		{Event: &datav1.InputEvent_Text{Text: &datav1.TextInput{Text: "x"}}}}}))
	wantCode(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureStage_FAILURE_STAGE_DELIVERING_INPUT)
	if !strings.Contains(err.Error(), "carries no display") {
		t.Errorf("DeliverInput: %v, want it to say the template carries no display", err)
	}
}

// TestDisplayThroughTheProcessService starts Xvfb as the guest agent
// does, through the process service, and serves its screen and input.
func TestDisplayThroughTheProcessService(t *testing.T) {
	hosttest.RequireXvfb(t)
	number := hosttest.FreeDisplay(t)
	e := newDisplayEnv(t, func(procs *ProcessService) *DisplayService {
		d, err := x11.Start(context.Background(), x11.Config{Number: number, Width: 320, Height: 240, Logf: t.Logf,
			Launch: func(args []string, tag string) (<-chan struct{}, error) {
				return procs.Launch(&datav1.StartProcessRequest{Args: args, Tag: tag})
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
		return NewDisplayService(d, "")
	})
	ctx := testCtx(t, 30*time.Second)
	list, err := e.pc.ListProcesses(ctx, connect.NewRequest(&datav1.ListProcessesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetTag() != x11.ServerTag || ps[0].GetArgs()[1] != fmt.Sprintf(":%d", number) {
		t.Fatalf("processes %v, want Xvfb tagged %q", ps, x11.ServerTag)
	}
	shot, err := e.screen.CaptureScreen(ctx, connect.NewRequest(&datav1.CaptureScreenRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot.Msg.GetPng()))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 320 || b.Dy() != 240 || shot.Msg.GetWidth() != 320 || shot.Msg.GetHeight() != 240 {
		t.Fatalf("capture %v, %dx%d; want 320x240", b, shot.Msg.GetWidth(), shot.Msg.GetHeight())
	}
	move := func(x, y uint32) *datav1.InputEvent {
		return &datav1.InputEvent{Event: &datav1.InputEvent_PointerMove{PointerMove: &datav1.PointerMoveInput{X: x, Y: y}}}
	}
	if _, err := e.input.DeliverInput(ctx, connect.NewRequest(&datav1.DeliverInputRequest{Events: []*datav1.InputEvent{move(10, 20)}})); err != nil {
		t.Fatal(err)
	}
	_, err = e.input.DeliverInput(ctx, connect.NewRequest(&datav1.DeliverInputRequest{Events: []*datav1.InputEvent{move(320, 20)}}))
	wantCode(t, err, connect.CodeInvalidArgument, ctrlv1.FailureStage_FAILURE_STAGE_DELIVERING_INPUT)

	// A display whose server ended answers unavailable.
	server := &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Tag{Tag: x11.ServerTag}}
	if _, err := e.pc.SignalProcess(ctx, connect.NewRequest(&datav1.SignalProcessRequest{Process: server, Signal: "KILL"})); err != nil {
		t.Fatal(err)
	}
	stream, err := e.pc.ConnectProcess(ctx, connect.NewRequest(&datav1.ConnectProcessRequest{Process: server}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
	}
	stream.Close()
	_, err = e.screen.CaptureScreen(ctx, connect.NewRequest(&datav1.CaptureScreenRequest{}))
	wantCode(t, err, connect.CodeUnavailable, ctrlv1.FailureStage_FAILURE_STAGE_CAPTURING_SCREEN)
	_, err = e.input.DeliverInput(ctx, connect.NewRequest(&datav1.DeliverInputRequest{Events: []*datav1.InputEvent{move(10, 20)}}))
	wantCode(t, err, connect.CodeUnavailable, ctrlv1.FailureStage_FAILURE_STAGE_DELIVERING_INPUT)
}
