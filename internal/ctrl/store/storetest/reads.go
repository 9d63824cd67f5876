package storetest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// testReadsFollowWrites reads each object and workspace by ID again and
// again in ViewCached (a backend may serve such reads from memory) and checks that every
// kind of write shows in the next read, and that a rolled-back one does
// not.
func testReadsFollowWrites(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	o := object(store.KindEgress, "p1", "e1", map[string]string{"team": "a"})
	w := store.Workspace{ProjectID: "p1", ID: "w1", TemplateID: "base", Body: []byte("v1"),
		Labels: map[string]string{"env": "a"}, CreatedAt: now, UpdatedAt: now}
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.CreateObject(ctx, o), tx.CreateWorkspace(ctx, w))
	})
	read := func(step string, wantSpec, wantTeam, wantBody, wantEnv string, wantDeleted bool) {
		t.Helper()
		for range 3 {
			viewCached(t, s, func(tx store.Tx) error {
				got, err := tx.Object(ctx, store.KindEgress, "p1", "e1")
				if err != nil || string(got.Spec) != wantSpec || got.Labels["team"] != wantTeam || got.Deleted() != wantDeleted {
					t.Fatalf("%s: object = %+v, %v; want spec %q, team %q, deleted %v", step, got, err, wantSpec, wantTeam, wantDeleted)
				}
				// What a reader does to its copy stays with it.
				got.Labels["team"], got.Spec[0] = "changed", 'X'
				gotW, err := tx.Workspace(ctx, "p1", "w1")
				if err != nil || string(gotW.Body) != wantBody || gotW.Labels["env"] != wantEnv {
					t.Fatalf("%s: workspace = %+v, %v; want body %q, env %q", step, gotW, err, wantBody, wantEnv)
				}
				gotW.Labels["env"], gotW.Body[0] = "changed", 'X'
				if _, err := tx.Object(ctx, store.KindResolver, "p1", "e1"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("%s: e1 read as a resolver: %v", step, err)
				}
				return nil
			})
		}
	}
	read("created", "spec-e1", "a", "v1", "a", false)

	o.Spec, o.Revision, o.Labels = []byte("v2"), 2, map[string]string{"team": "b"}
	w.Body, w.Labels = []byte("v2"), map[string]string{"env": "b"}
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.UpdateObject(ctx, o), tx.UpdateWorkspace(ctx, w))
	})
	read("updated", "v2", "b", "v2", "b", false)

	failed := errors.New("abandoned")
	rolledBack, rolledBackW := o, w
	rolledBack.Spec, rolledBackW.Body = []byte("v3"), []byte("v3")
	if err := s.Update(ctx, func(tx store.Tx) error {
		return errors.Join(tx.UpdateObject(ctx, rolledBack), tx.UpdateWorkspace(ctx, rolledBackW), failed)
	}); !errors.Is(err, failed) {
		t.Fatalf("abandoned update: %v", err)
	}
	read("after a failed update", "v2", "b", "v2", "b", false)

	o.DeletedAt = now.Add(time.Minute)
	update(t, s, func(tx store.Tx) error { return tx.UpdateObject(ctx, o) })
	read("deleted", "v2", "b", "v2", "b", true)
}

// testReadsUnderWrites races ViewCached readers against writers and
// checks what a client can see: a read that begins after a write was answered sees it,
// and one View sees rows of one moment, even when some come from a
// backend's memory and others from the database.
func testReadsUnderWrites(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	o := object(store.KindEgress, "p1", "e1", nil)
	o.Revision = 0
	w := store.Workspace{ProjectID: "p1", ID: "w1", TemplateID: "base", Body: []byte("0"), CreatedAt: now, UpdatedAt: now}
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.CreateObject(ctx, o), tx.CreateWorkspace(ctx, w))
	})
	const writes = 200
	var answered atomic.Uint64 // the highest revision a writer was answered for
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		defer close(done)
		for rev := uint64(1); rev <= writes; rev++ {
			o.Revision, w.Body = rev, fmt.Appendf(nil, "%d", rev)
			if err := s.Update(ctx, func(tx store.Tx) error {
				return errors.Join(tx.UpdateObject(ctx, o), tx.UpdateWorkspace(ctx, w))
			}); err != nil {
				t.Errorf("write %d: %v", rev, err)
				return
			}
			answered.Store(rev)
		}
	})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				floor := answered.Load()
				err := s.ViewCached(ctx, func(tx store.Tx) error {
					got, err := tx.Object(ctx, store.KindEgress, "p1", "e1")
					if err != nil {
						return err
					}
					if got.Revision < floor {
						return fmt.Errorf("read revision %d after revision %d was answered", got.Revision, floor)
					}
					// The workspace's body is written with the object, in
					// the same transaction.
					gotW, err := tx.Workspace(ctx, "p1", "w1")
					if err != nil {
						return err
					}
					if want := fmt.Sprint(got.Revision); string(gotW.Body) != want {
						return fmt.Errorf("one view read object revision %d beside workspace body %q", got.Revision, gotW.Body)
					}
					// A list is read from the database in any backend.
					list, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindEgress, ProjectID: "p1", Limit: 1})
					if err != nil {
						return err
					}
					if len(list) != 1 || list[0].Revision != got.Revision {
						return fmt.Errorf("one view read object revision %d by ID and %v in a list", got.Revision, list)
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// testViewRunsOnce: a View's fn runs once, even when a commit lands
// between a read by ID (which a backend may have in memory) and a read of
// the database, since a View's fn may gather what it reads.
func testViewRunsOnce(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	update(t, s, func(tx store.Tx) error { return tx.CreateObject(ctx, object(store.KindEgress, "p1", "e1", nil)) })
	for range 2 { // the second read may come from memory
		viewCached(t, s, func(tx store.Tx) error {
			_, err := tx.Object(ctx, store.KindEgress, "p1", "e1")
			return err
		})
	}
	runs, n := 0, 0
	view(t, s, func(tx store.Tx) error {
		runs++
		if _, err := tx.Object(ctx, store.KindEgress, "p1", "e1"); err != nil {
			return err
		}
		update(t, s, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte("v")) })
		list, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindEgress, ProjectID: "p1", Limit: 10})
		n += len(list)
		return err
	})
	if runs != 1 || n != 1 {
		t.Errorf("a View with a commit between its reads ran %d times and gathered %d objects; want once and 1", runs, n)
	}
}

func viewCached(t *testing.T, s store.Store, fn func(store.Tx) error) {
	t.Helper()
	if err := s.ViewCached(ctx, fn); err != nil {
		t.Fatalf("view: %v", err)
	}
}
