package server_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/command"
)

// TestPrunedWorkspaceIsNotFound: a workspace deleted before the retention
// window is pruned and reads not_found, and its DeleteWorkspace replayed
// is a new command on no workspace; one deleted within the window still
// reads DELETED.
func TestPrunedWorkspaceIsNotFound(t *testing.T) {
	f := newFleet(t)
	ctx := t.Context()
	remove := func(del *ctrlv1.DeleteWorkspaceRequest) {
		t.Helper()
		if _, err := f.workspaces.DeleteWorkspace(ctx, connect.NewRequest(del)); err != nil {
			t.Fatal(err)
		}
	}
	get := func(id string) (*ctrlv1.Workspace, error) {
		resp, err := f.workspaces.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Workspace, nil
	}
	wantDeleted := func(what, id string) {
		t.Helper()
		if ws, err := get(id); err != nil || ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			t.Errorf("%s: %v, %v; want it DELETED", what, ws.GetState(), err)
		}
	}

	old, owner, _ := f.stoppedWorkspace()
	deleteOld := &ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: old}
	remove(deleteOld)
	f.observe(owner, old, hostv1.ObservedState_OBSERVED_STATE_DELETED)
	wantDeleted("a deleted workspace", old)
	time.Sleep(time.Millisecond)
	cut := time.Now()
	recent, owner, _ := f.stoppedWorkspace()
	remove(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: recent})
	f.observe(owner, recent, hostv1.ObservedState_OBSERVED_STATE_DELETED)

	if _, err := command.Prune(ctx, f.srv.Store, cut); err != nil {
		t.Fatal(err)
	}
	_, err := get(old)
	wantCode(t, "a workspace deleted before the retention window", err, connect.CodeNotFound)
	_, err = f.workspaces.DeleteWorkspace(ctx, connect.NewRequest(deleteOld))
	wantCode(t, "its deletion replayed after the window", err, connect.CodeNotFound)
	wantDeleted("a workspace deleted within the retention window", recent)
}
