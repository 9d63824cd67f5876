package sdk

import (
	"context"
	"errors"
	"io"
	"iter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// ListWorkspaces returns the project's Workspaces, every page of them;
// with a selector, only those carrying each of its entries as a label of
// exactly that value.
func (c *Client) ListWorkspaces(ctx context.Context, selector map[string]string) ([]*ctrlv1.Workspace, error) {
	var all []*ctrlv1.Workspace
	req := &ctrlv1.ListWorkspacesRequest{LabelSelector: selector}
	for {
		resp, err := c.workspaces().ListWorkspaces(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		all = append(all, resp.Msg.GetWorkspaces()...)
		if req.PageToken = resp.Msg.GetNextPageToken(); req.PageToken == "" {
			return all, nil
		}
	}
}

// WatchWorkspace yields the Workspace id as it is now, then each change,
// until ctx ends, the loop breaks, or the stream fails (the error is the
// last value yielded). A DELETED Workspace ends the stream without error.
func (c *Client) WatchWorkspace(ctx context.Context, id string) iter.Seq2[*ctrlv1.Workspace, error] {
	return func(yield func(*ctrlv1.Workspace, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := c.workspaces().WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			yield(nil, err)
			return
		}
		defer stream.Close()
		for stream.Receive() {
			if !yield(stream.Msg().GetWorkspace(), nil) {
				return
			}
		}
		if err := stream.Err(); err != nil && !errors.Is(err, io.EOF) {
			yield(nil, err)
		} else if err := ctx.Err(); err != nil {
			yield(nil, err)
		}
	}
}

// Refresh reads the Workspace again; Info returns what it read.
func (w *Workspace) Refresh(ctx context.Context) (*ctrlv1.Workspace, error) {
	resp, err := w.c.workspaces().GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: w.id}))
	if err != nil {
		return nil, err
	}
	return w.stored(resp.Msg.GetWorkspace()), nil
}

// stored records ws, as a call returned it, as the handle's Info.
func (w *Workspace) stored(ws *ctrlv1.Workspace) *ctrlv1.Workspace {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.info = ws
	return ws
}

// SetLabels replaces all the Workspace's labels (nil clears them). It
// replaces the labels as they are when it reads them: a concurrent
// update between its read and its write makes it fail with aborted.
func (w *Workspace) SetLabels(ctx context.Context, labels map[string]string) (*ctrlv1.Workspace, error) {
	cur, err := w.Refresh(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := w.c.workspaces().UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{
		Command: commandMetadata(""), WorkspaceId: w.id, ExpectedLabelsRevision: cur.GetLabelsRevision(), Labels: labels,
	}))
	if err != nil {
		return nil, err
	}
	return w.stored(resp.Msg.GetWorkspace()), nil
}

// SetAnnotations replaces all the Workspace's annotations, as SetLabels
// does the labels.
func (w *Workspace) SetAnnotations(ctx context.Context, annotations map[string]string) (*ctrlv1.Workspace, error) {
	cur, err := w.Refresh(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := w.c.workspaces().UpdateWorkspaceAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceAnnotationsRequest{
		Command: commandMetadata(""), WorkspaceId: w.id, ExpectedAnnotationsRevision: cur.GetAnnotationsRevision(), Annotations: annotations,
	}))
	if err != nil {
		return nil, err
	}
	return w.stored(resp.Msg.GetWorkspace()), nil
}

// SetNetworkPolicy replaces the Workspace's network policy (its revision
// field is ignored), over the revision it reads first: a concurrent update
// makes it fail with aborted. It returns once the policy is stored; a
// running Workspace applies it live, which network_policy_status confirms.
func (w *Workspace) SetNetworkPolicy(ctx context.Context, policy *ctrlv1.NetworkPolicy) (*ctrlv1.Workspace, error) {
	cur, err := w.Refresh(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := w.c.workspaces().UpdateWorkspaceNetworkPolicy(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
		Command: commandMetadata(""), WorkspaceId: w.id, ExpectedRevision: cur.GetSpec().GetNetworkPolicy().GetRevision(), Policy: policy,
	}))
	if err != nil {
		return nil, err
	}
	return w.stored(resp.Msg.GetWorkspace()), nil
}

// SetTimeout makes the Workspace delete itself d from now, replacing any
// expiration it had; use SetExpiration to stop it instead.
func (w *Workspace) SetTimeout(ctx context.Context, d time.Duration) (*ctrlv1.Workspace, error) {
	return w.SetExpiration(ctx, &ctrlv1.WorkspaceExpirationPolicy{
		Deadline: timestamppb.New(time.Now().Add(d)),
		Action:   ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE,
	})
}

// SetExpiration replaces the Workspace's expiration policy; nil clears it.
func (w *Workspace) SetExpiration(ctx context.Context, policy *ctrlv1.WorkspaceExpirationPolicy) (*ctrlv1.Workspace, error) {
	change := &ctrlv1.WorkspaceExpirationChange{Change: &ctrlv1.WorkspaceExpirationChange_Clear{Clear: &emptypb.Empty{}}}
	if policy != nil {
		change.Change = &ctrlv1.WorkspaceExpirationChange_Set{Set: policy}
	}
	resp, err := w.c.workspaces().UpdateWorkspaceExpiration(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceExpirationRequest{
		Command: commandMetadata(""), WorkspaceId: w.id, Change: change,
	}))
	if err != nil {
		return nil, err
	}
	return w.stored(resp.Msg.GetWorkspace()), nil
}
