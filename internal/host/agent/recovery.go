package agent

import (
	"context"
	"log/slog"

	"github.com/kibotos/kibotos/internal/host/diskimage"
)

// recoverExecutions adopts the executions an earlier process of this host
// agent left running and releases the network namespaces of the others.
// A leftover that cannot be released now must not keep the host from
// serving: adopt what runs, and converge releases the rest later.
func (a *Agent) recoverExecutions(ctx context.Context) {
	running, err := a.cfg.Driver.Recover(ctx)
	if err != nil {
		slog.Error("recovering executions (continuing with those found running)", "err", err)
	}
	for _, id := range running {
		slog.Info("recovered running execution", "execution", id)
		a.adopt(ctx, id)
	}
	if ctx.Err() != nil {
		return // stopping amid the recovery: what it did not reach may run
	}
	a.releaseSlotsExcept(ctx, running)
}

// releaseTransferMounts releases the mounts of exports and restores that
// an earlier process left: the images they mounted are whole (an export
// only reads, a restore renames its image into place once it is
// complete), so nothing else is lost.
func (a *Agent) releaseTransferMounts() {
	dirs := []string{a.cfg.LayerDir}
	for _, p := range a.vols.pools {
		dirs = append(dirs, p.Dir)
	}
	for _, dir := range dirs {
		if err := diskimage.ReleaseMounts(dir); err != nil {
			slog.Error("releasing the mounts of an interrupted transfer", "dir", dir, "err", err)
		}
	}
}

// adopt tracks an execution found running at start.
func (a *Agent) adopt(ctx context.Context, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.newExecution(ctx, id, true).reopenSlot()
}
