package command

import (
	"context"
	"log/slog"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// DefaultRetention is how long a command's record is kept. Within it a
// retry replays the first answer; after it the record is gone, and the
// same command_id runs as a new command.
const DefaultRetention = 7 * 24 * time.Hour

// MinRetention is the shortest retention PruneLoop takes: the hosts hear
// of an Egress deleted within its longest drain (an hour,
// resource.MaxDrainSeconds) from its row.
const MinRetention = time.Hour

// pruneBatch bounds the rows one transaction deletes, so that pruning
// never holds the writer for long.
const pruneBatch = 1000

// Prune deletes every command record created before the given time and
// every row of what ended before it (store.Tx.PruneDeleted: a deleted
// workspace, Volume, Transfer, Egress, Resolver or Template, an ended
// exposure, a revoked token), and returns how many rows it deleted. A
// replay after that runs as a new command, and the resource it named is
// not_found.
func Prune(ctx context.Context, s store.Store, before time.Time) (int, error) {
	commands, err := inBatches(ctx, s, func(tx store.Tx) (int, error) {
		return tx.PruneCommands(ctx, before, pruneBatch)
	})
	if err != nil {
		return commands, err
	}
	ended, err := inBatches(ctx, s, func(tx store.Tx) (int, error) {
		return tx.PruneDeleted(ctx, before, pruneBatch)
	})
	return commands + ended, err
}

// inBatches runs prune, which deletes up to pruneBatch rows, a transaction
// at a time until it deletes fewer, and returns how many it deleted.
func inBatches(ctx context.Context, s store.Store, prune func(store.Tx) (int, error)) (int, error) {
	total := 0
	for {
		var n int
		err := s.Update(ctx, func(tx store.Tx) error {
			var err error
			n, err = prune(tx)
			return err
		})
		total += n
		if err != nil || n < pruneBatch {
			return total, err
		}
	}
}

// PruneLoop prunes the rows older than retention (MinRetention at least)
// now and then every tenth of it (at most hourly), until ctx ends.
func PruneLoop(ctx context.Context, s store.Store, retention time.Duration) {
	retention = max(retention, MinRetention)
	every := min(retention/10, time.Hour)
	for {
		if n, err := Prune(ctx, s, time.Now().Add(-retention)); err != nil && ctx.Err() == nil {
			slog.Warn("commands: prune failed", "err", err)
		} else if n > 0 {
			slog.Info("commands: pruned records and deleted resources past retention", "rows", n, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
