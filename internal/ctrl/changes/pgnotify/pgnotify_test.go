package pgnotify_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/internal/ctrl/changes/pgnotify"
	"github.com/kibotos/kibotos/internal/testutil"
)

// start runs a relay on dbURL until the test ends and returns once it
// listens.
func start(t *testing.T, dbURL string) *pgnotify.Relay {
	t.Helper()
	r := pgnotify.New(dbURL)
	listening := r.Broker().ChangedID("listening")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	<-listening
	return r
}

// TestRelayAcrossReplicas: a change published on one replica wakes the
// waiters of that workspace and of any change on the other, and no
// waiter of another workspace; the log line is the wake-up latency
// between replicas.
func TestRelayAcrossReplicas(t *testing.T) {
	dbURL := testutil.PostgresDatabase(t)
	one, two := start(t, dbURL), start(t, dbURL)

	ws, other, any := two.Broker().ChangedID("ws-1"), two.Broker().ChangedID("ws-2"), two.Broker().Changed()
	one.Broker().Publish("ws-1")
	<-ws
	<-any
	select {
	case <-other:
		t.Fatal("a change of ws-1 woke the waiters of ws-2")
	default:
	}
	// An empty ID wakes everyone, both ways.
	back := one.Broker().ChangedID("ws-3")
	two.Broker().Publish("")
	<-other
	<-back

	const n = 200
	lat := make([]time.Duration, n)
	for i := range n {
		id := fmt.Sprint("lat-", i)
		woken := two.Broker().ChangedID(id)
		t0 := time.Now()
		one.Broker().Publish(id)
		<-woken
		lat[i] = time.Since(t0)
	}
	slices.Sort(lat)
	t.Logf("wake-up latency between replicas over %d changes: p50 %v p90 %v p99 %v", n, lat[n/2], lat[n*9/10], lat[n*99/100])
}

// TestRelayReconnects: a replica whose listening connection is lost wakes
// every waiter once it listens again (it may have missed changes), and
// then sees the other replicas' changes again.
func TestRelayReconnects(t *testing.T) {
	dbURL := testutil.PostgresDatabase(t)
	one, two := start(t, dbURL), start(t, dbURL)

	relistened := two.Broker().ChangedID("nothing-published")
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var killed int
	if err := conn.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 2 {
		t.Fatalf("terminated %d listening connections, want 2", killed)
	}
	<-relistened

	// one may not listen again yet, but its notifications go out.
	woken := two.Broker().ChangedID("ws-after")
	one.Broker().Publish("ws-after")
	<-woken
}
