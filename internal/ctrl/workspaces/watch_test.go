package workspaces

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// countingStore counts reads (View and ViewCached).
type countingStore struct {
	store.Store
	views atomic.Int64
}

func (c *countingStore) View(ctx context.Context, fn func(store.Tx) error) error {
	c.views.Add(1)
	return c.Store.View(ctx, fn)
}

func (c *countingStore) ViewCached(ctx context.Context, fn func(store.Tx) error) error {
	c.views.Add(1)
	return c.Store.ViewCached(ctx, fn)
}

// TestWatchersShareOneRead: 100 watchers of one workspace all see its
// change for one store read, and the watcher of another workspace is not
// woken at all.
func TestWatchersShareOneRead(t *testing.T) {
	s, ctx := newService(t)
	counted := &countingStore{Store: s.Store}
	s.Store = counted
	a, b, c := create(t, s, ctx, 128<<20), create(t, s, ctx, 128<<20), create(t, s, ctx, 128<<20)
	relabel := func(ws *ctrlv1.Workspace) {
		t.Helper()
		if _, err := UpdateMap(ctx, s, write("labels", newWS), resource.Labels, ws.WorkspaceId, ws.LabelsRevision,
			map[string]string{"seen": "yes"}, identity); err != nil {
			t.Fatal(err)
		}
	}
	// What a relabel reads by itself, with nobody watching.
	before := counted.views.Load()
	relabel(c)
	own := counted.views.Load() - before

	var (
		ready, seen sync.WaitGroup
		otherWoken  atomic.Bool
	)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 100 {
		ready.Add(1)
		seen.Add(1)
		go s.Watch(wctx, a.WorkspaceId, 1<<62, func(ws *ctrlv1.Workspace) error {
			if ws.LabelsRevision == a.LabelsRevision {
				ready.Done()
			} else {
				seen.Done()
			}
			return nil
		})
	}
	ready.Add(1)
	go s.Watch(wctx, b.WorkspaceId, 1<<62, func(ws *ctrlv1.Workspace) error {
		if ws.LabelsRevision == b.LabelsRevision {
			ready.Done()
		} else {
			otherWoken.Store(true)
		}
		return nil
	})
	ready.Wait()
	// Each watcher began with a read of its own; the feeds' readers read
	// once as they start, which may come after.
	for _, ws := range []*ctrlv1.Workspace{a, b} {
		for !s.feedRead(watchKey{"p1", ws.WorkspaceId}) {
			time.Sleep(time.Millisecond)
		}
	}

	before = counted.views.Load()
	relabel(a)
	seen.Wait()
	if reads := counted.views.Load() - before - own; reads != 1 {
		t.Errorf("100 watchers cost %d store reads for one change, want 1", reads)
	}
	if otherWoken.Load() {
		t.Error("the watcher of another workspace was sent a version")
	}
}

// TestWatchBeginsWithTheStateNow: a watcher that joins a feed whose
// reader has not yet read a committed change (here one made through
// another replica, which this one hears of only at its next poll) begins
// with the workspace as it is now, not with the feed's older version: a
// caller that changes a workspace and then watches it sees its change.
func TestWatchBeginsWithTheStateNow(t *testing.T) {
	s, ctx := newService(t)
	ws := create(t, s, ctx, 128<<20)
	first := watch(t, s, ctx, ws.WorkspaceId)
	if got := first(); got.LabelsRevision != ws.LabelsRevision {
		t.Fatalf("the first watcher began with labels revision %d, want %d", got.LabelsRevision, ws.LabelsRevision)
	}
	replica := &Service{Store: s.Store, Pages: s.Pages, Checker: s.Checker, Changes: changes.NewBroker()}
	relabeled, err := UpdateMap(ctx, replica, write("labels", newWS), resource.Labels, ws.WorkspaceId, ws.LabelsRevision,
		map[string]string{"seen": "yes"}, identity)
	if err != nil {
		t.Fatal(err)
	}
	if got := watch(t, s, ctx, ws.WorkspaceId)(); got.LabelsRevision != relabeled.LabelsRevision {
		t.Errorf("a watcher joining after the change began with labels revision %d, want %d", got.LabelsRevision, relabeled.LabelsRevision)
	}
}

// feedRead reports whether the feed of key has read its workspace.
func (s *Service) feedRead(key watchKey) bool {
	s.watches.mu.Lock()
	f := s.watches.feeds[key]
	s.watches.mu.Unlock()
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ws != nil
}
