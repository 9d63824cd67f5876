package workspaces

import (
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// retentionTiers returns the three tiers of a workspace without a Volume:
// PROMISED (no path, NOT_DECLARED), BEST_EFFORT (/, the writable layer,
// with its continuity and, once it exists, its capacity) and NONE (/tmp
// and /run, tmpfs).
func retentionTiers(continuity *continuity, capacity uint64, layerExists bool) []*ctrlv1.RetentionTier {
	bestEffort := &ctrlv1.RetentionTier{
		Kind:         ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT,
		Paths:        []string{"/"},
		Availability: ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_UNAVAILABLE,
		Continuity:   ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_UNKNOWN,
	}
	if layerExists {
		bestEffort.Availability = ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_AVAILABLE
		bestEffort.CapacityBytes = &capacity
	}
	if continuity != nil {
		bestEffort.Continuity, bestEffort.ResetReason = continuity.kind, continuity.reason
	}
	return []*ctrlv1.RetentionTier{
		{
			Kind:         ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED,
			Paths:        []string{},
			Availability: ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_NOT_DECLARED,
		},
		bestEffort,
		{
			Kind:         ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_NONE,
			Paths:        []string{"/tmp", "/run"},
			Availability: ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_AVAILABLE,
			Continuity:   ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET,
		},
	}
}

// continuity is what became of the writable layer at the last start.
type continuity struct {
	kind   ctrlv1.RetentionContinuity
	reason ctrlv1.RetentionResetReason
}

// markDeleted marks tiers as a deleted workspace has them: its writable
// layer (BEST_EFFORT) and its tmpfs (NONE) are gone. Its PROMISED tier
// shows its Volume as the Volume is (present).
func markDeleted(tiers []*ctrlv1.RetentionTier) {
	for _, t := range tiers {
		if t.Kind != ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_PROMISED {
			t.Availability, t.CapacityBytes = ctrlv1.RetentionAvailability_RETENTION_AVAILABILITY_UNAVAILABLE, nil
		}
	}
}
