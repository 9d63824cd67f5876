package templates

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// Garbage collection of image blobs. The control plane owns the blobs of its
// image store: a blob stays while a revision listed by a live Template (of
// any project, built-ins included) needs it. A deleted Template's revisions
// are no one's (reviving the ID starts with none), so their blobs go, as do
// those of a failed import. What an import committed within BlobGrace stays
// whatever the store says, since the import records its revision only after
// committing the blobs (and measuring its layers, which for a large archive
// takes minutes). Unpacked layers are the hosts' to collect.
const (
	// BlobGrace spares blobs committed this recently.
	BlobGrace = time.Hour
	// collectEvery is how often CollectLoop runs.
	collectEvery = time.Minute
)

// CollectBlobs removes the blobs of images no live Template's revision uses
// that no import committed since cutoff, and returns their digests.
func CollectBlobs(ctx context.Context, st store.Store, images *imagestore.Store, cutoff time.Time) ([]string, error) {
	var manifests []string
	err := st.View(ctx, func(tx store.Tx) error {
		manifests = nil
		projects, err := tx.Projects(ctx)
		if err != nil {
			return err
		}
		ids := []string{BuiltinProject}
		for _, p := range projects {
			ids = append(ids, p.ID)
		}
		all, err := allTemplates(ctx, tx, ids, nil)
		if err != nil {
			return err
		}
		for _, t := range all {
			for _, r := range t.spec.GetRevisions() {
				manifests = append(manifests, r.GetImageDigest())
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for _, m := range manifests {
		img, err := images.Image(m)
		if errors.Is(err, imagestore.ErrNotFound) {
			continue // nothing of it to keep
		}
		if err != nil {
			return nil, err
		}
		for _, b := range img.Blobs() {
			keep[b] = true
		}
	}
	return images.RemoveBlobs(keep, cutoff)
}

// CollectLoop runs CollectBlobs at once (what a restart finds deleted goes)
// and then every minute, with BlobGrace, until ctx ends.
func CollectLoop(ctx context.Context, st store.Store, images *imagestore.Store) error {
	tick := time.NewTicker(collectEvery)
	defer tick.Stop()
	for {
		removed, err := CollectBlobs(ctx, st, images, time.Now().Add(-BlobGrace))
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			slog.Error("collecting template blobs", "err", err)
		case len(removed) > 0:
			slog.Info("removed template blobs no revision uses", "count", len(removed))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
