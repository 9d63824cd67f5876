package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// DefaultMemoryBytes is the guest RAM of a Workspace created without
// CreateOptions.MemoryBytes.
const DefaultMemoryBytes = 512 << 20

// rewatchDelay is the pause before watching again when a watch ended
// before the Workspace got where a call waits for it.
const rewatchDelay = time.Second

// CreateOptions describe a new Workspace; zero fields take the defaults.
type CreateOptions struct {
	// Template is a Template ID, or ID@REVISION for one revision; empty is
	// the deployment's built-in Template, and no revision its default one.
	Template string
	// CPUMillis is the CPU share in thousandths of a core; 0 is the
	// server's default.
	CPUMillis uint32
	// MemoryBytes is the guest RAM, a whole number of MiB and at least
	// 128 MiB; 0 is DefaultMemoryBytes.
	MemoryBytes uint64
	// DiskBytes is the capacity of the writable layer, a whole number of
	// MiB; 0 is the host's default.
	DiskBytes uint64
	// Capabilities the host must offer, such as "screen".
	Capabilities []string
	// NetworkPolicy is the initial network policy; nil is DENY_ALL.
	NetworkPolicy *ctrlv1.NetworkPolicy
	// Expiration is the initial expiration; nil sets none.
	Expiration *ctrlv1.WorkspaceExpirationPolicy
	// Labels and Annotations are stored with the Workspace.
	Labels, Annotations map[string]string
	// Volume binds a Volume: mode NEW creates one with the Workspace,
	// BOUND binds the existing VolumeID; nil binds none.
	Volume *ctrlv1.WorkspaceVolumeBinding
	// CommandID is the idempotency key of the create; empty is a fresh one.
	// Retrying with the same ID and options returns the first Workspace.
	CommandID string
}

func (o CreateOptions) request() (*ctrlv1.CreateWorkspaceRequest, error) {
	spec := &ctrlv1.WorkspaceCreateSpec{
		Resources:     &ctrlv1.ResourceRequest{CpuMillis: o.CPUMillis, MemoryBytes: o.MemoryBytes, WritableLayerBytes: o.DiskBytes},
		NetworkPolicy: o.NetworkPolicy,
		Expiration:    o.Expiration,
		Volume:        o.Volume,
	}
	if spec.Resources.MemoryBytes == 0 {
		spec.Resources.MemoryBytes = DefaultMemoryBytes
	}
	if o.Template != "" {
		id, rev, hasRev := strings.Cut(o.Template, "@")
		if id == "" || (hasRev && rev == "") {
			return nil, fmt.Errorf("template %q: want ID or ID@REVISION", o.Template)
		}
		spec.Template = &ctrlv1.TemplateSelector{TemplateId: id, Revision: rev}
	}
	if len(o.Capabilities) > 0 {
		spec.Capabilities = &ctrlv1.CapabilityRequirements{Required: o.Capabilities}
	}
	return &ctrlv1.CreateWorkspaceRequest{
		Command:     commandMetadata(o.CommandID),
		Spec:        spec,
		Labels:      o.Labels,
		Annotations: o.Annotations,
	}, nil
}

func commandMetadata(id string) *ctrlv1.CommandMetadata {
	if id == "" {
		id = uuid.NewString()
	}
	return &ctrlv1.CommandMetadata{CommandId: id}
}

// CreateWorkspace creates a Workspace and waits until it is AVAILABLE. A
// Workspace that ends FAILED is a *StateError carrying its failure; when
// ctx ends first, the Workspace goes on starting and the error is ctx's.
func (c *Client) CreateWorkspace(ctx context.Context, o CreateOptions) (*Workspace, error) {
	req, err := o.request()
	if err != nil {
		return nil, err
	}
	resp, err := c.workspaces().CreateWorkspace(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return c.awaitHandle(ctx, resp.Msg.GetWorkspace(), untilAvailable)
}

// Workspace returns a handle on the Workspace id as it is now, in whatever
// state. An unknown Workspace is not_found.
func (c *Client) Workspace(ctx context.Context, id string) (*Workspace, error) {
	resp, err := c.workspaces().GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		return nil, err
	}
	return c.handle(resp.Msg.GetWorkspace()), nil
}

// StartWorkspace starts a STOPPED Workspace, or retries the launch of a
// FAILED one, and waits until it is AVAILABLE. Sessions issued before the
// start do not work after it: use the returned handle.
func (c *Client) StartWorkspace(ctx context.Context, id string) (*Workspace, error) {
	resp, err := c.workspaces().StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Command: commandMetadata(""), WorkspaceId: id}))
	if err != nil {
		return nil, err
	}
	return c.awaitHandle(ctx, resp.Msg.GetWorkspace(), untilAvailable)
}

// StopOptions describe a stop.
type StopOptions struct {
	// Force ends the execution at once, without syncing the guest; its
	// durability is UNCONFIRMED.
	Force bool
}

// StopWorkspace stops a Workspace and waits until it is STOPPED. The
// returned handle's Info is the Workspace as stopped; its last_stop says how.
func (c *Client) StopWorkspace(ctx context.Context, id string, o StopOptions) (*Workspace, error) {
	mode := ctrlv1.StopMode_STOP_MODE_NORMAL
	if o.Force {
		mode = ctrlv1.StopMode_STOP_MODE_FORCE
	}
	resp, err := c.workspaces().StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Command: commandMetadata(""), WorkspaceId: id, Mode: mode}))
	if err != nil {
		return nil, err
	}
	return c.awaitHandle(ctx, resp.Msg.GetWorkspace(), untilStopped)
}

// DeleteWorkspace deletes a Workspace and waits until it is DELETED.
func (c *Client) DeleteWorkspace(ctx context.Context, id string) error {
	resp, err := c.workspaces().DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: commandMetadata(""), WorkspaceId: id}))
	if err != nil {
		return err
	}
	_, err = c.waitFor(ctx, resp.Msg.GetWorkspace(), untilDeleted)
	return err
}

// awaitHandle waits until ws, as a lifecycle call returned it, reaches g and
// returns a handle on it.
func (c *Client) awaitHandle(ctx context.Context, ws *ctrlv1.Workspace, g goal) (*Workspace, error) {
	ws, err := c.waitFor(ctx, ws, g)
	if err != nil {
		return nil, err
	}
	return c.handle(ws), nil
}

// goal is a state a call waits for, and the states on the way to it.
type goal struct {
	state ctrlv1.WorkspaceState
	via   []ctrlv1.WorkspaceState
}

var (
	untilAvailable = goal{ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, []ctrlv1.WorkspaceState{
		ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING,
		ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING,
		ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN,
	}}
	untilStopped = goal{ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, []ctrlv1.WorkspaceState{
		ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING,
		ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN,
	}}
	untilDeleted = goal{ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, []ctrlv1.WorkspaceState{
		ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING,
	}}
)

// waitFor follows WatchWorkspace from ws, the state a call returned, until
// the Workspace is in g's state. A watch that ends early, or that the
// server cannot serve for a moment (unavailable), is opened again.
func (c *Client) waitFor(ctx context.Context, ws *ctrlv1.Workspace, g goal) (*ctrlv1.Workspace, error) {
	for rewatch := false; ; rewatch = true {
		switch s := ws.GetState(); {
		case s == g.state:
			return ws, nil
		case !slices.Contains(g.via, s):
			return nil, &StateError{Workspace: ws, Want: g.state}
		}
		if rewatch {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(rewatchDelay):
			}
		}
		var err error
		ws, err = c.watch(ctx, ws, g)
		switch {
		case g.state == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED && connect.CodeOf(err) == connect.CodeNotFound:
			return ws, nil // gone altogether
		case err != nil && connect.CodeOf(err) != connect.CodeUnavailable:
			return nil, err
		}
	}
}

// watch reads one WatchWorkspace stream until the Workspace is in g's
// state or leaves the way to it, and returns the last state it saw.
func (c *Client) watch(ctx context.Context, ws *ctrlv1.Workspace, g goal) (*ctrlv1.Workspace, error) {
	stream, err := c.workspaces().WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: ws.GetWorkspaceId()}))
	if err != nil {
		return ws, err
	}
	defer stream.Close()
	for stream.Receive() {
		ws = stream.Msg().GetWorkspace()
		if s := ws.GetState(); s == g.state || !slices.Contains(g.via, s) {
			return ws, nil
		}
	}
	if err := stream.Err(); err != nil && !errors.Is(err, io.EOF) {
		return ws, err
	}
	if err := ctx.Err(); err != nil {
		return ws, err
	}
	return ws, nil
}

// Workspace is a handle on one Workspace. Its data-plane methods (Exec,
// Start, Upload, ...) need the Workspace AVAILABLE; they share one session,
// which the handle issues on first use and issues again when it is within
// 30 seconds of expiry or the data plane reports it expired.
type Workspace struct {
	c    *Client
	id   string
	info *ctrlv1.Workspace

	mu  sync.Mutex
	dp  *dataPlane        // nil until the first data-plane call
	set map[string]string // SetEnv's
}

func (c *Client) handle(ws *ctrlv1.Workspace) *Workspace {
	return &Workspace{c: c, id: ws.GetWorkspaceId(), info: ws}
}

// SetEnv sets environment variables every process the handle starts gets,
// over the Client's WithEnv and under ExecOptions.Env, key by key. It
// replaces the handle's earlier SetEnv.
func (w *Workspace) SetEnv(env map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.set = maps.Clone(env)
}

// env merges the Client's, the handle's and a process's environment.
func (w *Workspace) env(own map[string]string) map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.c.env) == 0 && len(w.set) == 0 {
		return own
	}
	env := maps.Clone(w.c.env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, w.set)
	maps.Copy(env, own)
	return env
}

// ID returns the Workspace's ID.
func (w *Workspace) ID() string { return w.id }

// Info returns the Workspace as it was when the handle was made, or as the
// handle's last update (SetLabels, SetTimeout, ...) returned it. Callers
// must not modify it.
func (w *Workspace) Info() *ctrlv1.Workspace {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.info
}
