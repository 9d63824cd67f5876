package workspaces

import (
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates/templatetest"
	"github.com/kibotos/kibotos/internal/guestabi"
)

// TestDisplayCapabilities checks that screen and input need both a host
// that offers them and a template revision that carries a display, and
// that the display reaches the host in the assignment.
func TestDisplayCapabilities(t *testing.T) {
	s, ctx := newService(t)
	if err := s.Store.Update(ctx, func(tx store.Tx) error { return templatetest.PutDesktop(ctx, tx, time.Now()) }); err != nil {
		t.Fatal(err)
	}
	createWith := func(template string, required ...string) (*ctrlv1.Workspace, error) {
		return Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{
			Template:     &ctrlv1.TemplateSelector{TemplateId: template},
			Resources:    &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20},
			Capabilities: &ctrlv1.CapabilityRequirements{Required: required},
		}, nil, nil, identity)
	}
	unavailable := func(err error, says string) {
		t.Helper()
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), says) {
			t.Fatalf("got %v, want failed_precondition saying %q", err, says)
		}
		d, _ := ce.Details()[0].Value()
		if d.(*ctrlv1.ErrorDetail).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE {
			t.Fatalf("%v: detail %v, want CAPABILITY_UNAVAILABLE", err, d)
		}
	}

	// h1 registered without them.
	_, err := createWith("desktop", guestabi.CapabilityScreen)
	unavailable(err, "not offered by any host")

	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capabilities: []string{guestabi.CapabilityScreen, guestabi.CapabilityInput},
		Capacity: &hostv1.HostCapacity{CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{guestabi.CapabilityScreen, guestabi.CapabilityInput} {
		_, err := createWith("base", c)
		unavailable(err, "carries none")
	}
	ws, err := createWith("desktop", guestabi.CapabilityScreen, guestabi.CapabilityInput)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := createWith("base")
	if err != nil {
		t.Fatal(err)
	}
	as, err := s.Assignments(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as.Assignments {
		d := a.GetTemplate().GetDisplay()
		switch a.WorkspaceId {
		case ws.WorkspaceId:
			if d.GetWidth() != templatetest.DesktopDisplay.Width || d.GetHeight() != templatetest.DesktopDisplay.Height {
				t.Errorf("the desktop workspace's assignment has display %v, want %v", d, templatetest.DesktopDisplay)
			}
		case plain.WorkspaceId:
			if d != nil {
				t.Errorf("the base workspace's assignment has display %v", d)
			}
		}
	}
}
