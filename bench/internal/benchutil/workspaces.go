package benchutil

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// Workspaces creates the small idle workspaces a benchmark measures, as
// the deployment's operator admin, and deletes them all at the end.
type Workspaces struct {
	client ctrlv1connect.WorkspaceServiceClient
	mu     sync.Mutex
	// IDs are the workspaces created so far, in order; Create may be
	// called from several goroutines, so read it once they are done.
	IDs []string
}

// Connect returns Workspaces of the deployment at addr whose home is home.
func Connect(addr, home string) (*Workspaces, error) {
	token, err := AdminToken(home)
	if err != nil {
		return nil, err
	}
	return &Workspaces{client: ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, "http://"+addr,
		connect.WithInterceptors(bearer.Token(token)))}, nil
}

// Create creates one workspace of 0.1 CPU, 128 MiB of memory and a 64 MiB
// writable layer, and returns its ID without waiting for it.
func (w *Workspaces) Create(ctx context.Context) (string, error) {
	resp, err := w.client.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
		Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{
			CpuMillis: 100, MemoryBytes: 128 << 20, WritableLayerBytes: 64 << 20}},
	}))
	if err != nil {
		return "", err
	}
	id := resp.Msg.Workspace.WorkspaceId
	w.mu.Lock()
	w.IDs = append(w.IDs, id)
	w.mu.Unlock()
	return id, nil
}

// Await polls the workspace every poll until done says it is ready; a
// FAILED workspace is an error.
func (w *Workspaces) Await(ctx context.Context, id string, poll time.Duration, done func(*ctrlv1.Workspace) bool) error {
	for {
		got, err := w.client.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			return err
		}
		ws := got.Msg.Workspace
		if ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED {
			return fmt.Errorf("workspace %s failed: %v", id, ws.Failure)
		}
		if done(ws) {
			return nil
		}
		time.Sleep(poll)
	}
}

// Watch follows WatchWorkspace, as the SDK waits, until done says the
// workspace is ready; a FAILED or DELETED workspace, or a watch that
// ends first, is an error.
func (w *Workspaces) Watch(ctx context.Context, id string, done func(*ctrlv1.Workspace) bool) error {
	stream, err := w.client.WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		ws := stream.Msg().GetWorkspace()
		switch {
		case done(ws):
			return nil
		case ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
			return fmt.Errorf("workspace %s is %s: %v", id, ws.GetState(), ws.GetFailure())
		}
	}
	return fmt.Errorf("the watch of %s ended: %v", id, stream.Err())
}

// Available reports whether a workspace is AVAILABLE.
func Available(ws *ctrlv1.Workspace) bool {
	return ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
}

// DeleteAll deletes every workspace created, ignoring errors: it is the
// benchmark's cleanup. It returns once every one is DELETED (its host has
// released it), so that a deployment stopped right after leaves none
// running, or after deleteWait, saying on stderr how many are left.
func (w *Workspaces) DeleteAll(ctx context.Context) {
	for _, id := range w.IDs {
		w.client.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{
			Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, WorkspaceId: id}))
	}
	ctx, cancel := context.WithTimeout(ctx, deleteWait)
	defer cancel()
	left := 0
	for _, id := range w.IDs {
		err := w.Await(ctx, id, 100*time.Millisecond, func(ws *ctrlv1.Workspace) bool {
			return ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
		})
		if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			left++
		}
	}
	if left > 0 {
		fmt.Fprintf(os.Stderr, "%d of the %d workspaces created are not DELETED after %v\n", left, len(w.IDs), deleteWait)
	}
}

// deleteWait bounds DeleteAll's wait for the hosts' releases.
const deleteWait = 2 * time.Minute

// PoolEntries returns the runtime IDs of the warm pool entries that serve
// the workspace's executions, from home's record of bound executions.
func PoolEntries(home, id string) []string {
	bound, _ := filepath.Glob(filepath.Join(home, "layers", ".pool", "bound", id+"-*"))
	var rids []string
	for _, alias := range bound {
		if rid, err := os.ReadFile(alias); err == nil {
			rids = append(rids, strings.TrimSpace(string(rid)))
		}
	}
	return rids
}

// GuestSocket returns the path of the guest agent's data socket of the
// workspace's running execution under home, which the host's gateway
// dials: the execution's own or, when a warm pool entry serves it, the
// entry's.
func GuestSocket(home, id string) (string, error) {
	names, _ := filepath.Glob(filepath.Join(home, "runtime", "exec", id+"-*"))
	for _, rid := range PoolEntries(home, id) {
		names = append(names, filepath.Join(home, "runtime", "exec", rid))
	}
	for _, dir := range names {
		path := filepath.Join(dir, "sock", guestabi.DataSocket)
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("no data socket of workspace %s under %s", id, home)
}

// CgroupSum sums one counter file of the workspaces' cgroups in a cgroup
// v1 controller, where the OCI driver puts them: ("memory",
// "memory.usage_in_bytes") is the memory charged to them, ("cpuacct",
// "cpuacct.usage") the nanoseconds of CPU they spent. A file that cannot
// be read counts as zero. An execution a warm pool entry serves is under
// the entry's name, which home's record of bound executions gives.
func CgroupSum(home string, ids []string, controller, file string) uint64 {
	var total uint64
	for _, id := range ids {
		paths, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", controller, "kibotos", id+"-*", file))
		for _, rid := range PoolEntries(home, id) {
			paths = append(paths, filepath.Join("/sys/fs/cgroup", controller, "kibotos", rid, file))
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			total += v
		}
	}
	return total
}
