package agent

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
)

// Garbage collection of unpacked template layers and of writable layers.
// The host owns the layers it unpacked
// into its template store (the blobs are ctrl's, even where both share the
// store). A layer goes once no execution here uses it and its blob is gone,
// which ctrl does when no live template revision needs it; layers of live
// revisions stay, so a workspace starting again finds them unpacked.
const (
	// layerGrace spares a layer that Unpack handed out this recently: the
	// execution that asked for it may not be assigned here yet.
	layerGrace = 10 * time.Minute
	// collectLayersEvery is how often collectLayers runs.
	collectLayersEvery = time.Minute
)

// collectLayers removes unused template layers and the writable layers
// no workspace will use again every minute, and after an execution no
// longer assigned is forgotten, until ctx ends, starting once the host is
// registered.
func (a *Agent) collectLayers(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.registered:
	}
	tick := time.NewTicker(collectLayersEvery)
	defer tick.Stop()
	for {
		a.collectLayersOnce(time.Now().Add(-layerGrace))
		a.collectWritableLayers(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-a.collectNow:
		}
	}
}

// kickCollector has collectLayers run soon.
func (a *Agent) kickCollector() {
	select {
	case a.collectNow <- struct{}{}:
	default:
	}
}

// collectLayersOnce removes the layers of no execution here that were last
// handed out before cutoff. While an execution's assignment is unknown (one
// adopted at start before ctrl's first answer, or one being torn down) it
// removes nothing: that execution may have any layer mounted.
func (a *Agent) collectLayersOnce(cutoff time.Time) {
	inUse, ok := a.layersInUse()
	if !ok {
		return
	}
	removed, err := a.cfg.Template.RemoveLayers(inUse, cutoff)
	if err != nil {
		slog.Error("collecting template layers", "err", err)
	}
	if len(removed) > 0 {
		slog.Info("removed template layers no execution or live revision uses", "count", len(removed))
	}
}

// layersInUse returns the DiffIDs of the layers of every execution here;
// false while an execution's assignment is unknown.
func (a *Agent) layersInUse() (map[string]bool, bool) {
	inUse := map[string]bool{}
	if !a.eachAssignment(func(as *hostv1.Assignment) {
		for _, l := range as.GetTemplate().GetLayers() {
			inUse[l.GetDiffId()] = true
		}
	}) {
		return nil, false
	}
	for _, id := range a.pool.layersInUse() {
		inUse[id] = true
	}
	return inUse, true
}

// writableLayersAssigned returns the IDs of the writable layers the
// executions here are assigned; false while an execution's assignment is
// unknown, or before ctrl's first assignments arrived.
func (a *Agent) writableLayersAssigned() (map[string]bool, bool) {
	if !a.converged.Load() {
		return nil, false
	}
	named := map[string]bool{}
	if !a.eachAssignment(func(as *hostv1.Assignment) { named[as.LayerId] = true }) {
		return nil, false
	}
	return named, true
}

// eachAssignment calls fn with the assignment of every execution here,
// under a.mu; false, without calling it, while an execution's assignment
// is unknown (one adopted at start before ctrl's first answer, or one
// being torn down: it may have any layer mounted).
func (a *Agent) eachAssignment(fn func(*hostv1.Assignment)) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.execs {
		if as, known := e.get(); !known || as == nil {
			return false
		}
	}
	for _, e := range a.execs {
		as, _ := e.get()
		fn(as)
	}
	return true
}

// maxLayersAsked bounds the layer IDs of one CollectableLayers call; a
// round asks about more in several.
const maxLayersAsked = 500

// collectWritableLayers deletes the writable layer images kept here that
// no assignment names and that ctrl says no workspace will use again:
// those of workspaces deleted, and those left behind by a start elsewhere,
// while this host was LOST. Ctrl names only layers of workspaces it knows.
func (a *Agent) collectWritableLayers(ctx context.Context) {
	named, ok := a.writableLayersAssigned()
	if !ok {
		return
	}
	entries, err := os.ReadDir(a.cfg.LayerDir)
	if err != nil {
		slog.Error("collecting writable layers", "err", err)
		return
	}
	var unnamed []string
	for _, entry := range entries {
		id, image := strings.CutSuffix(entry.Name(), ".ext4")
		// Temporary images (".NAME.tmp-*") and the pool's directory are
		// not layers of a workspace.
		if image && !strings.HasPrefix(id, ".") && entry.Type().IsRegular() && !named[id] {
			unnamed = append(unnamed, id)
		}
	}
	for asked := range slices.Chunk(unnamed, maxLayersAsked) {
		resp, err := a.cfg.Client.CollectableLayers(ctx, connect.NewRequest(&hostv1.CollectableLayersRequest{HostId: a.cfg.HostID, LayerIds: asked}))
		if err != nil {
			slog.Warn("asking ctrl which writable layers no workspace will use again", "err", err)
			return
		}
		for _, id := range resp.Msg.GetLayerIds() {
			if slices.Contains(asked, id) {
				a.deleteDeadLayer(id)
			}
		}
	}
}

// deleteDeadLayer deletes the writable layer id unless an execution was
// assigned it meanwhile.
func (a *Agent) deleteDeadLayer(id string) {
	lock := a.layerLock(id)
	lock.Lock()
	defer lock.Unlock()
	if named, ok := a.writableLayersAssigned(); !ok || named[id] {
		return
	}
	if err := a.cfg.Layers.DeleteLayer(a.layerPath(id)); err != nil {
		slog.Warn("deleting a writable layer no workspace will use again", "layer", id, "err", err)
		return
	}
	slog.Info("deleted a writable layer no workspace will use again", "layer", id)
}
