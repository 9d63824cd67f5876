package workspaces

// This file is resource changes: memory and the writable layer, under
// CAS on resources_revision.

import (
	"context"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/scheduler"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// stoppedForResources refuses a resources change while the workspace
// holds an execution: what an execution receives is always exactly what
// its spec says.
func stoppedForResources(ctx context.Context, tx store.Tx, r *record) error {
	switch r.ws.State {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
		return nil
	}
	return precondition(observed(ctx, tx, r), "workspace %s is %s; resources change only while it is STOPPED or FAILED", r.ws.WorkspaceId, StateName(r.ws.State))
}

// UpdateMemory replaces memory_bytes under CAS on resources_revision; it
// takes effect at the next start, where capacity is judged.
func UpdateMemory[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, expected, memory uint64, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	if memory%MiB != 0 || memory < MinMemoryBytes {
		return zero, invalid("memory_bytes %d must be a whole number of MiB and at least 128 MiB", memory)
	}
	return updateResources(ctx, s, w, id, expected, respond, func(ctx context.Context, tx store.Tx, r *record, res *ctrlv1.ResourceRequest) error {
		if res.MemoryBytes == memory {
			return nil
		}
		if r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			// The running execution gets a raise at once; lowering the
			// limit under a guest's feet waits for a stop.
			if memory < res.MemoryBytes {
				return precondition(observed(ctx, tx, r), "workspace %s is AVAILABLE; memory is lowered only while it is STOPPED or FAILED, and raised at any time it is AVAILABLE", r.ws.WorkspaceId)
			}
			if err := s.fitsMore(ctx, tx, r, scheduler.Request{MemoryBytes: memory - res.MemoryBytes}); err != nil {
				return err
			}
		} else if err := stoppedForResources(ctx, tx, r); err != nil {
			return precondition(observed(ctx, tx, r), "workspace %s is %s; memory is raised while it is AVAILABLE, and changed either way while it is STOPPED or FAILED",
				r.ws.WorkspaceId, StateName(r.ws.State))
		}
		res.MemoryBytes = memory
		r.ws.Spec.ResourcesRevision++
		r.row.MemoryBytes = memory
		return nil
	})
}

// updateResources is what UpdateMemory and ResizeWritableLayer share: the
// required expected_resources_revision, a live workspace, and CAS on
// resources_revision before change edits the resources.
func updateResources[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, expected uint64, respond func(*ctrlv1.Workspace) R,
	change func(ctx context.Context, tx store.Tx, r *record, res *ctrlv1.ResourceRequest) error) (R, error) {
	if expected == 0 {
		var zero R
		return zero, invalid("expected_resources_revision is required: send the revision you observed")
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		if err := live(ctx, tx, r); err != nil {
			return err
		}
		if rev := r.ws.Spec.ResourcesRevision; rev != expected {
			return command.Aborted("resources_revision", expected, rev)
		}
		return change(ctx, tx, r, r.ws.Spec.Resources)
	}, respond)
}

// ResizeWritableLayer grows writable_layer_bytes under CAS on
// resources_revision. The added bytes are reserved on the workspace's host
// now; the host grows the layer at the next start.
func ResizeWritableLayer[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, expected, bytes uint64, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	if bytes == 0 || bytes%MiB != 0 {
		return zero, invalid("writable_layer_bytes %d must be a positive whole number of MiB", bytes)
	}
	return updateResources(ctx, s, w, id, expected, respond, func(ctx context.Context, tx store.Tx, r *record, res *ctrlv1.ResourceRequest) error {
		current := max(res.WritableLayerBytes, r.row.LayerBytes)
		for _, t := range r.ws.RetentionTiers {
			if t.Kind == ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT {
				current = max(current, t.GetCapacityBytes())
			}
		}
		switch {
		case bytes == current:
			return nil
		case bytes < current:
			return invalid("writable_layer_bytes %d is below the layer's %d bytes: the layer only grows", bytes, current)
		}
		if err := stoppedForResources(ctx, tx, r); err != nil {
			return err
		}
		if err := s.fitsMore(ctx, tx, r, scheduler.Request{LayerBytes: bytes - r.row.LayerBytes}); err != nil {
			return err
		}
		res.WritableLayerBytes = bytes
		r.ws.Spec.ResourcesRevision++
		r.row.LayerBytes = bytes
		return nil
	})
}
