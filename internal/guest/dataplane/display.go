package dataplane

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/guest/x11"
)

// The stages of the display's services.
const (
	stageCapturingScreen = ctrlv1.FailureStage_FAILURE_STAGE_CAPTURING_SCREEN
	stageDeliveringInput = ctrlv1.FailureStage_FAILURE_STAGE_DELIVERING_INPUT
)

// NoDisplay is why a guest whose template carries no display has none.
const NoDisplay = "this workspace's template carries no display: create it from a template with one, such as desktop"

// DisplayService implements ScreenService and InputService over the
// guest's X display.
type DisplayService struct {
	datav1connect.UnimplementedScreenServiceHandler
	datav1connect.UnimplementedInputServiceHandler

	display *x11.Display
	missing string // why there is no display
}

// NewDisplayService serves display. Without one (nil), every call is
// failed_precondition with missing as its message: NoDisplay, or why the
// display did not start.
func NewDisplayService(display *x11.Display, missing string) *DisplayService {
	return &DisplayService{display: display, missing: missing}
}

// CaptureScreen implements ScreenService.CaptureScreen.
func (s *DisplayService) CaptureScreen(ctx context.Context, req *connect.Request[datav1.CaptureScreenRequest]) (*connect.Response[datav1.CaptureScreenResponse], error) {
	if s.display == nil {
		return nil, newError(connect.CodeFailedPrecondition, stageCapturingScreen, "%s", s.missing)
	}
	shot, err := s.display.Capture()
	if err != nil {
		return nil, displayError(stageCapturingScreen, err)
	}
	return connect.NewResponse(&datav1.CaptureScreenResponse{Png: shot.PNG, Width: uint32(shot.Width), Height: uint32(shot.Height)}), nil
}

// DeliverInput implements InputService.DeliverInput.
func (s *DisplayService) DeliverInput(ctx context.Context, req *connect.Request[datav1.DeliverInputRequest]) (*connect.Response[datav1.DeliverInputResponse], error) {
	if s.display == nil {
		return nil, newError(connect.CodeFailedPrecondition, stageDeliveringInput, "%s", s.missing)
	}
	if err := s.display.Deliver(req.Msg.GetEvents()); err != nil {
		return nil, displayError(stageDeliveringInput, err)
	}
	return connect.NewResponse(&datav1.DeliverInputResponse{}), nil
}

// displayError maps an error of the display: a refused batch is
// invalid_argument, a display that stopped answering unavailable.
func displayError(stage ctrlv1.FailureStage, err error) error {
	code := connect.CodeInternal
	switch {
	case errors.Is(err, x11.ErrInvalidInput):
		code = connect.CodeInvalidArgument
	case errors.Is(err, x11.ErrDisplay):
		code = connect.CodeUnavailable
	}
	return withStage(connect.NewError(code, err), stage)
}
