package transfers

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"gocloud.dev/blob"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// This file is the loop that keeps every Transfer truthful between
// calls: restores follow their workspace, artifacts expire, deletions
// finish, uploads that went away fail, and blobs no Transfer holds go.

// uploadIdle is how long an IMPORTING Transfer may go without progress
// before the loop takes its upload as gone: a live upload stores its
// progress every progressEvery.
const uploadIdle = 30 * time.Second

// Run sweeps every period and whenever a change is published, until ctx
// ends.
func (s *Service) Run(ctx context.Context, every time.Duration) {
	for {
		var changed <-chan struct{}
		if s.Changes != nil {
			changed = s.Changes.Changed()
		}
		if err := s.Sweep(ctx, time.Time{}); err != nil && ctx.Err() == nil {
			slog.Warn("transfers: sweep failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(every):
		}
	}
}

// Sweep runs the loop's work once. Imports whose progress was last stored
// before orphanedBefore, or longer than uploadIdle ago, have lost their
// upload: a deployment with a single ctrl passes its own start time, so
// that after a crash no import stays IMPORTING.
func (s *Service) Sweep(ctx context.Context, orphanedBefore time.Time) error {
	now := s.Now.UTC()
	if idle := now.Add(-uploadIdle); idle.After(orphanedBefore) {
		orphanedBefore = idle
	}
	var deleting []string
	changed := false
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		deleting, changed = deleting[:0], false
		rows, err := tx.PendingTransfers(ctx, 1000)
		if err != nil {
			return err
		}
		for _, row := range rows {
			r, err := decode(row)
			if err != nil {
				return err
			}
			moved := false
			switch r.T.State {
			case ctrlv1.TransferState_TRANSFER_STATE_RESTORING:
				if moved, err = s.follow(ctx, tx, r); err != nil {
					return err
				}
			case ctrlv1.TransferState_TRANSFER_STATE_IMPORTING:
				if row.UpdatedAt.Before(orphanedBefore) {
					s.fail(r, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE, ctrlv1.FailureStage_FAILURE_STAGE_IMPORTING_TRANSFER,
						"the upload ended before the artifact was whole (its connection or ctrl went away)")
					moved = true
				}
			case ctrlv1.TransferState_TRANSFER_STATE_DELETING:
				deleting = append(deleting, r.T.TransferId)
			}
			if moved {
				changed = true
				if err := s.save(ctx, tx, r); err != nil {
					return err
				}
			}
		}
		expired, err := tx.ExpiredTransfers(ctx, now, 100)
		if err != nil {
			return err
		}
		for _, row := range expired {
			r, err := decode(row)
			if err != nil {
				return err
			}
			switch r.T.State {
			case ctrlv1.TransferState_TRANSFER_STATE_COMPLETE, ctrlv1.TransferState_TRANSFER_STATE_IMPORTED,
				ctrlv1.TransferState_TRANSFER_STATE_RESTORED:
				r.T.State, r.Book.Stored = ctrlv1.TransferState_TRANSFER_STATE_EXPIRED, false
				r.Row.ExpiresAt = time.Time{}
			case ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, ctrlv1.TransferState_TRANSFER_STATE_IMPORTING,
				ctrlv1.TransferState_TRANSFER_STATE_RESTORING:
				r.Row.ExpiresAt = now.Add(time.Minute) // once the work ends
			default:
				r.Row.ExpiresAt = time.Time{} // nothing is stored
			}
			changed = true
			if err := s.save(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if changed {
		s.changed()
	}
	for _, id := range deleting {
		if err := s.finishDelete(ctx, id); err != nil {
			return err
		}
	}
	return s.Collect(ctx)
}

// Collect deletes the blobs no Transfer holds: committed artifacts of
// Transfers that are FAILED, DELETED, EXPIRED or unknown, and staging
// blobs of Transfers no longer receiving one.
func (s *Service) Collect(ctx context.Context) error {
	var errs []error
	for _, prefix := range []string{artifactPrefix, stagingPrefix} {
		it := s.Bucket.List(&blob.ListOptions{Prefix: prefix})
		for {
			obj, err := it.Next(ctx)
			if errors.Is(err, context.Canceled) || ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				errs = append(errs, err)
				break
			}
			id, staging, ok := transferOfKey(obj.Key)
			if !ok {
				continue
			}
			keep, err := s.holds(ctx, id, staging)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !keep {
				if err := deleteBlob(ctx, s.Bucket, obj.Key); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// holds reports whether the Transfer id holds a committed artifact, or
// (staging) may be receiving one.
func (s *Service) holds(ctx context.Context, id string, staging bool) (bool, error) {
	keep := false
	err := s.Store.View(ctx, func(tx store.Tx) error {
		r, err := loadByID(ctx, tx, id)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if staging {
			keep = r.T.State == ctrlv1.TransferState_TRANSFER_STATE_EXPORTING || r.T.State == ctrlv1.TransferState_TRANSFER_STATE_IMPORTING
		} else {
			keep = holdsArtifact(r.T.State)
		}
		return nil
	})
	return keep, err
}
