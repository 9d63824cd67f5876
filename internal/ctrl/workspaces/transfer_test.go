package workspaces

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// TestExpirationWaitsForAnExport: an expiration that deletes a workspace
// being exported deletes it once the export ends, as DeleteWorkspace
// waits for it; it had deleted the workspace under the export.
func TestExpirationWaitsForAnExport(t *testing.T) {
	s, ctx := newService(t)
	c := &clock{now: time.Now()}
	s.Now = c.get
	ws, err := Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 512 << 20},
		Expiration: &ctrlv1.WorkspaceExpirationPolicy{Deadline: timestamppb.New(c.get().Add(time.Minute)),
			Action: ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE}}, nil, nil, identity)
	if err != nil {
		t.Fatal(err)
	}
	exporting := "tr_1"
	s.Exporting = func(context.Context, store.Tx, string, string, string) (string, error) { return exporting, nil }
	c.add(2 * time.Minute)
	state := func() ctrlv1.WorkspaceState {
		t.Helper()
		if err := s.Expire(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, ws.WorkspaceId)
		if err != nil {
			t.Fatal(err)
		}
		return got.State
	}
	if st := state(); st == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING {
		t.Fatalf("an expiration deleted a workspace being exported: %v", st)
	}
	exporting = ""
	if st := state(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING {
		t.Fatalf("once the export ended, the expired workspace is %v, want DELETING", st)
	}
}
