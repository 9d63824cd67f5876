package enumlabel

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

func TestLabels(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{Of(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE), "available"},
		{Of(ctrlv1.WorkspaceState_WORKSPACE_STATE_UNSPECIFIED), "unspecified"},
		{Of(ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_ENDPOINT_UNREACHABLE), "endpoint_unreachable"},
		{Of(ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_SATURATED), "saturated"},
		{Of(ctrlv1.WorkspaceState(42)), "42"},
	} {
		if c.got != c.want {
			t.Errorf("label %q, want %q", c.got, c.want)
		}
	}
	got := Known(ctrlv1.GuestCondition(0).Descriptor())
	want := []protoreflect.EnumNumber{protoreflect.EnumNumber(ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING),
		protoreflect.EnumNumber(ctrlv1.GuestCondition_GUEST_CONDITION_UNRESPONSIVE)}
	if !slices.Equal(got, want) {
		t.Errorf("known guest conditions %v, want %v", got, want)
	}
}
