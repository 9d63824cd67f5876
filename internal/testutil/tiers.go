package testutil

import ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"

// RetentionTier returns the retention tier of kind a workspace reports, or
// nil when it reports none.
func RetentionTier(ws *ctrlv1.Workspace, kind ctrlv1.RetentionTierKind) *ctrlv1.RetentionTier {
	for _, t := range ws.RetentionTiers {
		if t.Kind == kind {
			return t
		}
	}
	return nil
}
