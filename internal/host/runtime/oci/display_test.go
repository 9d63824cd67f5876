package oci

import (
	"slices"
	"testing"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// TestDisplayArgument: a spec with a display has the guest agent run it.
func TestDisplayArgument(t *testing.T) {
	spec := runtime.Spec{ID: "x", GuestAgent: "/agent"}
	if args := ociSpec(spec, "/rootfs", "/sock", "", 0, 0).Process.Args; !slices.Equal(args, []string{guestAgentPath}) {
		t.Errorf("without a display: args %q", args)
	}
	spec.Display = &guestabi.DisplaySize{Width: 1280, Height: 800}
	if args := ociSpec(spec, "/rootfs", "/sock", "", 0, 0).Process.Args; !slices.Equal(args, []string{guestAgentPath, "--display=1280x800"}) {
		t.Errorf("with a display: args %q", args)
	}
}
