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

// pruneBatch bounds the records one transaction deletes, so that pruning
// never holds the writer for long.
const pruneBatch = 1000

// Prune deletes every command record created before the given time and
// returns how many it deleted.
func Prune(ctx context.Context, s store.Store, before time.Time) (int, error) {
	total := 0
	for {
		var n int
		err := s.Update(ctx, func(tx store.Tx) error {
			var err error
			n, err = tx.PruneCommands(ctx, before, pruneBatch)
			return err
		})
		total += n
		if err != nil || n < pruneBatch {
			return total, err
		}
	}
}

// PruneLoop prunes the records older than retention now and then every
// tenth of it (at most hourly), until ctx ends.
func PruneLoop(ctx context.Context, s store.Store, retention time.Duration) {
	every := min(retention/10, time.Hour)
	for {
		if n, err := Prune(ctx, s, time.Now().Add(-retention)); err != nil && ctx.Err() == nil {
			slog.Warn("commands: prune failed", "err", err)
		} else if n > 0 {
			slog.Info("commands: pruned records past retention", "records", n, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
