// Package pgnotify relays the changes ctrl replicas publish through the
// PostgreSQL database they share: a replica's Publish becomes a NOTIFY on
// Channel right after its commit, and every replica LISTENs on Channel on
// a connection of its own and wakes its broker's waiters with what the
// others published.
package pgnotify

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/internal/ctrl/changes"
)

// Channel is the notification channel of the deployment's changes. A
// payload is the publishing replica's origin, a space, and the changed
// workspace's ID, or nothing for a change that may touch anything.
const Channel = "kibotos_changes"

// maxPending is how many distinct IDs wait for a NOTIFY before they are
// merged into one "anything changed".
const maxPending = 512

// Backoff bounds of a lost connection's reconnects.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// Relay carries its Broker's changes to and from the other replicas.
type Relay struct {
	url    string
	origin string
	broker *changes.Broker

	mu      sync.Mutex
	pending map[string]struct{}
	ready   chan struct{}
}

// New returns the relay of the database at url (postgres://...); Run
// starts it.
func New(url string) *Relay {
	b := make([]byte, 8)
	rand.Read(b)
	r := &Relay{url: url, origin: hex.EncodeToString(b), pending: map[string]struct{}{}, ready: make(chan struct{}, 1)}
	r.broker = changes.NewForwarding(r.queue)
	return r
}

// Broker is the broker whose changes the relay carries: the control
// plane's.
func (r *Relay) Broker() *changes.Broker { return r.broker }

// Run listens and notifies until ctx ends, connecting again after a lost
// connection. Once it listens (again), it wakes every waiter: changes
// notified while nothing listened were missed.
func (r *Relay) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.notifyLoop(ctx)
	}()
	r.listenLoop(ctx)
	<-done
}

// queue takes a Publish for the next NOTIFY.
func (r *Relay) queue(id string) {
	r.mu.Lock()
	if len(r.pending) >= maxPending {
		clear(r.pending)
		id = ""
	}
	r.pending[id] = struct{}{}
	r.mu.Unlock()
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

// take returns the payloads of the queued changes and empties the queue.
func (r *Relay) take(payloads []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, all := r.pending[""]; all {
		clear(r.pending)
		r.pending[""] = struct{}{}
	}
	for id := range r.pending {
		payloads = append(payloads, r.origin+" "+id)
	}
	clear(r.pending)
	return payloads
}

// notifyLoop sends the queued changes, all at once, whenever some are
// queued.
func (r *Relay) notifyLoop(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	var payloads []string
	backoff := minBackoff
	for {
		if len(payloads) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.ready:
			}
		}
		payloads = r.take(payloads)
		var err error
		if conn == nil {
			conn, err = pgx.Connect(ctx, r.url)
		}
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, Channel, payloads)
		}
		if err == nil {
			payloads, backoff = payloads[:0], minBackoff
			continue
		}
		if ctx.Err() != nil {
			return
		}
		slog.Warn("changes: notifying the other replicas failed; retrying", "err", err)
		if conn != nil {
			conn.Close(context.Background())
			conn = nil
		}
		if !sleep(ctx, &backoff) {
			return
		}
	}
}

// listenLoop listens until ctx ends.
func (r *Relay) listenLoop(ctx context.Context) {
	backoff := minBackoff
	for {
		err := r.listen(ctx, func() { backoff = minBackoff })
		if ctx.Err() != nil {
			return
		}
		slog.Warn("changes: listening for the other replicas' changes failed; reconnecting", "err", err)
		if !sleep(ctx, &backoff) {
			return
		}
	}
}

// listen connects, listens on Channel, and wakes the broker with every
// notification until the connection fails.
func (r *Relay) listen(ctx context.Context, listening func()) error {
	conn, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	listening()
	r.broker.Wake("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		origin, id, ok := strings.Cut(n.Payload, " ")
		switch {
		case !ok:
			r.broker.Wake("")
		case origin != r.origin:
			r.broker.Wake(id)
		}
	}
}

// sleep waits *backoff, doubling it up to maxBackoff; false if ctx ended.
func sleep(ctx context.Context, backoff *time.Duration) bool {
	t := time.NewTimer(*backoff)
	defer t.Stop()
	*backoff = min(2**backoff, maxBackoff)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
