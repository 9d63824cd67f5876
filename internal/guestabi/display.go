package guestabi

import (
	"fmt"
	"strconv"
	"strings"
)

// A template that carries a display says so, and gives the screen's size,
// in its image config's label DisplayLabel: "WIDTHxHEIGHT". The host
// passes the size to the guest agent as DisplayFlag; the agent then runs
// the X display DisplayName before it answers the readiness probe.
const (
	DisplayLabel = "io.kibotos.display"
	DisplayFlag  = "display"
	DisplayName  = ":0"
	// MinDisplaySide and MaxDisplaySide bound a display's width and
	// height in pixels.
	MinDisplaySide = 64
	MaxDisplaySide = 8192
)

// The capabilities a host offers for a template that carries a display:
// its guest agent serves kibotos.data.v1 ScreenService and InputService.
const (
	CapabilityScreen = "screen"
	CapabilityInput  = "input"
)

// DisplaySize is the size of a display's screen in pixels.
type DisplaySize struct {
	Width, Height uint32
}

// String returns the size as "WIDTHxHEIGHT", the form ParseDisplaySize
// reads.
func (s DisplaySize) String() string { return fmt.Sprintf("%dx%d", s.Width, s.Height) }

// Arg returns the guest agent's argument that has it run a display of
// this size.
func (s DisplaySize) Arg() string { return "--" + DisplayFlag + "=" + s.String() }

// ParseDisplaySize reads "WIDTHxHEIGHT", each a decimal number of pixels
// from MinDisplaySide to MaxDisplaySide.
func ParseDisplaySize(s string) (DisplaySize, error) {
	w, h, ok := strings.Cut(s, "x")
	width, werr := strconv.ParseUint(w, 10, 32)
	height, herr := strconv.ParseUint(h, 10, 32)
	if !ok || werr != nil || herr != nil {
		return DisplaySize{}, fmt.Errorf("display size %q is not WIDTHxHEIGHT", s)
	}
	for _, n := range []uint64{width, height} {
		if n < MinDisplaySide || n > MaxDisplaySide {
			return DisplaySize{}, fmt.Errorf("display size %q: width and height must be %d to %d pixels", s, MinDisplaySide, MaxDisplaySide)
		}
	}
	return DisplaySize{Width: uint32(width), Height: uint32(height)}, nil
}
