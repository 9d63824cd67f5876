package workspaces

// This file is the layers hosts keep that no workspace will use again:
// those of workspaces deleted while their host was LOST, and those left
// behind by a start elsewhere (record.layerID). Only the host knows which
// images it keeps, and only ctrl which of them are dead, so the host asks.

import (
	"context"
	"maps"
	"slices"
	"strings"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// MaxCollectableLayers bounds the layer IDs of one CollectableLayers call.
const MaxCollectableLayers = 1000

// CollectableLayers returns which of layerIDs, the writable layer images
// a host keeps that none of its assignments names, no workspace will use
// again: every layer of a DELETED workspace, and a live workspace's layers
// older than its current one. A layer of a workspace this control plane
// does not know, or its current layer, is never returned: a host pointed
// at the wrong control plane deletes nothing.
func (s *Service) CollectableLayers(ctx context.Context, hostID string, layerIDs []string) ([]string, error) {
	if len(layerIDs) > MaxCollectableLayers {
		return nil, invalid("layer_ids holds %d IDs; at most %d are asked at once", len(layerIDs), MaxCollectableLayers)
	}
	if err := s.CheckRegistered(ctx, hostID); err != nil {
		return nil, err
	}
	byWorkspace := map[string][]string{}
	for _, id := range layerIDs {
		ws, _, _ := strings.Cut(id, ".")
		byWorkspace[ws] = append(byWorkspace[ws], id)
	}
	var dead []string
	err := s.Store.View(ctx, func(tx store.Tx) error {
		records, err := decodeAll(tx.WorkspacesByID(ctx, slices.Sorted(maps.Keys(byWorkspace))))
		if err != nil {
			return err
		}
		for _, r := range records {
			for _, id := range byWorkspace[r.row.ID] {
				if r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED || r.leftBehind(id) {
					dead = append(dead, id)
				}
			}
		}
		return nil
	})
	return dead, err
}

// leftBehind reports whether layerID is one of the layers the workspace
// left behind on a LOST host: its names before the current one.
func (r *record) leftBehind(layerID string) bool {
	for moves := range r.book.LayerMoves {
		if layerID == layerName(r.row.ID, moves) {
			return true
		}
	}
	return false
}
