package agent

import (
	"context"
	"log/slog"
	"time"
)

// Garbage collection of unpacked layers. The host owns the layers it unpacked
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

// collectLayers removes unused layers every minute until ctx ends, starting
// once the host is registered.
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
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
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
	a.mu.Lock()
	defer a.mu.Unlock()
	inUse := map[string]bool{}
	for _, e := range a.execs {
		as, known := e.get()
		if !known || as == nil {
			return nil, false
		}
		for _, l := range as.GetTemplate().GetLayers() {
			inUse[l.GetDiffId()] = true
		}
	}
	for _, id := range a.pool.layersInUse() {
		inUse[id] = true
	}
	return inUse, true
}
