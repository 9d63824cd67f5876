// Package storetest is the one suite every store.Store backend must pass.
// A backend's test calls Run with a function that opens a fresh, empty,
// migrated store.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Open returns a fresh, empty store that the test owns.
type Open func(t *testing.T) store.Store

// Run runs the suite.
func Run(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"Settings", testSettings},
		{"ProjectsAndTokens", testProjectsAndTokens},
		{"Commands", testCommands},
		{"PruneCommands", testPruneCommands},
		{"PruneDeleted", testPruneDeleted},
		{"ConcurrentUpdatesFailAlone", testConcurrentUpdatesFailAlone},
		{"ObjectLifecycle", testObjectLifecycle},
		{"ObjectsAreScopedByKindAndProject", testObjectScoping},
		{"ListSelectorAndPages", testListSelectorAndPages},
		{"PolicyReferences", testPolicyReferences},
		{"FailedUpdateChangesNothing", testRollback},
		{"ConcurrentCompareAndSwap", testConcurrentCAS},
		{"ConcurrentSameCommand", testConcurrentSameCommand},
		{"Workspaces", testWorkspaces},
		{"DeadlinesBeyondNanoseconds", testFarDeadlines},
		{"LabelsOfMany", testLabelsOfMany},
		{"TemplatesAndHosts", testTemplatesAndHosts},
		{"HostTokens", testHostTokens},
		{"LaunchRevisions", testLaunchRevisions},
		{"Sessions", testSessions},
		{"VolumeLifecycle", testVolumeLifecycle},
		{"VolumeLists", testVolumeLists},
		{"FailedVolumeUpdateChangesNothing", testVolumeRollback},
		{"Exposures", testExposures},
		{"Transfers", testTransfers},
		{"ReadsFollowWrites", testReadsFollowWrites},
		{"ReadsUnderWrites", testReadsUnderWrites},
		{"ViewRunsOnce", testViewRunsOnce},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
	}
}

var ctx = context.Background()

// now is a fixed instant with nanoseconds, to check time round trips.
var now = time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)

func update(t *testing.T, s store.Store, fn func(store.Tx) error) {
	t.Helper()
	if err := s.Update(ctx, fn); err != nil {
		t.Fatalf("update: %v", err)
	}
}

func view(t *testing.T, s store.Store, fn func(store.Tx) error) {
	t.Helper()
	if err := s.View(ctx, fn); err != nil {
		t.Fatalf("view: %v", err)
	}
}

func mustProject(t *testing.T, s store.Store, id string) {
	t.Helper()
	update(t, s, func(tx store.Tx) error {
		return tx.CreateProject(ctx, store.Project{ID: id, Name: "name-" + id, CreatedAt: now})
	})
}

func testSettings(t *testing.T, s store.Store) {
	view(t, s, func(tx store.Tx) error {
		if _, err := tx.Setting(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("missing setting: got %v, want ErrNotFound", err)
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte{0, 1, 2}) })
	update(t, s, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte{3, 4}) })
	view(t, s, func(tx store.Tx) error {
		v, err := tx.Setting(ctx, "k")
		if err != nil || !bytes.Equal(v, []byte{3, 4}) {
			t.Errorf("setting = %v, %v; want [3 4]", v, err)
		}
		return nil
	})
}

func testProjectsAndTokens(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		return tx.CreateProject(ctx, store.Project{ID: "p1", Name: "one", Operator: true, CreatedAt: now})
	})
	err := s.Update(ctx, func(tx store.Tx) error {
		return tx.CreateProject(ctx, store.Project{ID: "p2", Name: "one", CreatedAt: now})
	})
	if !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate project name: got %v, want ErrExists", err)
	}
	mustProject(t, s, "p3")
	tok := store.Token{ID: "t1", ProjectID: "p1", Role: "admin", Name: "boot", SecretHash: []byte("hash"), CreatedAt: now}
	update(t, s, func(tx store.Tx) error { return tx.CreateToken(ctx, tok) })
	update(t, s, func(tx store.Tx) error { return tx.RevokeToken(ctx, "t1", now.Add(time.Hour)) })
	update(t, s, func(tx store.Tx) error { return tx.RevokeToken(ctx, "t1", now.Add(2*time.Hour)) })
	view(t, s, func(tx store.Tx) error {
		projects, err := tx.Projects(ctx)
		if err != nil || len(projects) != 2 || !projects[0].Operator || projects[1].Operator {
			t.Errorf("projects = %+v, %v", projects, err)
		}
		if p, err := tx.Project(ctx, "p1"); err != nil || !p.CreatedAt.Equal(now) || p.Name != "one" {
			t.Errorf("project = %+v, %v", p, err)
		}
		got, err := tx.Token(ctx, "t1")
		if err != nil {
			t.Fatal(err)
		}
		want := tok
		want.RevokedAt = now.Add(time.Hour)
		if !got.RevokedAt.Equal(want.RevokedAt) || !bytes.Equal(got.SecretHash, want.SecretHash) ||
			got.Role != "admin" || got.ProjectID != "p1" || !got.CreatedAt.Equal(now) {
			t.Errorf("token = %+v, want %+v", got, want)
		}
		if toks, err := tx.Tokens(ctx, "p3"); err != nil || len(toks) != 0 {
			t.Errorf("tokens of p3 = %v, %v", toks, err)
		}
		if _, err := tx.Token(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("missing token: %v", err)
		}
		return nil
	})
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.RevokeToken(ctx, "nope", now) }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoke missing token: %v", err)
	}
}

func testCommands(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	c := store.Command{ProjectID: "p1", CommandID: "c1", Method: "M", RequestHash: []byte{1}, Response: []byte{0, 9}, CreatedAt: now}
	update(t, s, func(tx store.Tx) error { return tx.PutCommand(ctx, c) })
	err := s.Update(ctx, func(tx store.Tx) error { return tx.PutCommand(ctx, c) })
	if !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate command: got %v, want ErrExists", err)
	}
	// The same command ID in another project is another command.
	c2 := c
	c2.ProjectID = "p2"
	update(t, s, func(tx store.Tx) error { return tx.PutCommand(ctx, c2) })
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Command(ctx, "p1", "c1")
		if err != nil || got.Method != "M" || !bytes.Equal(got.Response, c.Response) ||
			!bytes.Equal(got.RequestHash, c.RequestHash) || !got.CreatedAt.Equal(now) {
			t.Errorf("command = %+v, %v", got, err)
		}
		if _, err := tx.Command(ctx, "p1", "c2"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("missing command: %v", err)
		}
		return nil
	})
}

func testPruneCommands(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	for i := range 5 {
		update(t, s, func(tx store.Tx) error {
			return tx.PutCommand(ctx, store.Command{ProjectID: "p1", CommandID: fmt.Sprint("c", i), Method: "M",
				CreatedAt: now.Add(time.Duration(i) * time.Hour)})
		})
	}
	prune := func(before time.Time, limit int) int {
		var n int
		update(t, s, func(tx store.Tx) error {
			var err error
			n, err = tx.PruneCommands(ctx, before, limit)
			return err
		})
		return n
	}
	// Older than c3: c0, c1 and c2, oldest first, two at a time.
	if n := prune(now.Add(3*time.Hour), 2); n != 2 {
		t.Errorf("first prune deleted %d, want 2", n)
	}
	if n := prune(now.Add(3*time.Hour), 2); n != 1 {
		t.Errorf("second prune deleted %d, want 1", n)
	}
	view(t, s, func(tx store.Tx) error {
		for i := range 5 {
			_, err := tx.Command(ctx, "p1", fmt.Sprint("c", i))
			if kept := err == nil; kept != (i >= 3) {
				t.Errorf("command c%d kept = %v (%v)", i, kept, err)
			}
		}
		return nil
	})
}

// testConcurrentUpdatesFailAlone runs many Updates at once, every third
// of which writes and then fails: the failures leave nothing behind and
// take nothing of the others with them (a backend with group commit runs
// them in one transaction).
func testConcurrentUpdatesFailAlone(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	boom := errors.New("boom")
	const n = 64
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Update(ctx, func(tx store.Tx) error {
				if err := tx.CreateObject(ctx, object(store.KindEgress, "p1", fmt.Sprint("e", i), nil)); err != nil {
					return err
				}
				if err := tx.PutCommand(ctx, store.Command{ProjectID: "p1", CommandID: fmt.Sprint("c", i), Method: "M", CreatedAt: now}); err != nil {
					return err
				}
				if i%3 == 0 {
					return boom
				}
				return nil
			})
		}()
	}
	wg.Wait()
	view(t, s, func(tx store.Tx) error {
		for i := range n {
			failed := i%3 == 0
			if failed != errors.Is(errs[i], boom) || (!failed && errs[i] != nil) {
				t.Errorf("update %d: %v", i, errs[i])
			}
			_, errObj := tx.Object(ctx, store.KindEgress, "p1", fmt.Sprint("e", i))
			_, errCmd := tx.Command(ctx, "p1", fmt.Sprint("c", i))
			if (errObj == nil) == failed || (errCmd == nil) == failed {
				t.Errorf("update %d (failed %v): object %v, command %v", i, failed, errObj, errCmd)
			}
		}
		return nil
	})
}

func object(kind store.Kind, project, id string, labels map[string]string) store.Object {
	return store.Object{
		Kind: kind, ProjectID: project, ID: id, Spec: []byte("spec-" + id), Revision: 1,
		Labels: labels, LabelsRevision: 1, Annotations: map[string]string{"note": "a\nb"}, AnnotationsRevision: 1,
		CreatedAt: now, UpdatedAt: now,
	}
}

func testObjectLifecycle(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	o := object(store.KindEgress, "p1", "e1", map[string]string{"team": "a"})
	update(t, s, func(tx store.Tx) error { return tx.CreateObject(ctx, o) })
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.CreateObject(ctx, o) }); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate object: got %v, want ErrExists", err)
	}
	o.Spec, o.Revision, o.DrainSeconds = []byte("v2"), 2, 30
	o.Labels, o.LabelsRevision = map[string]string{"team": "b"}, 2
	o.UpdatedAt = now.Add(time.Second)
	update(t, s, func(tx store.Tx) error { return tx.UpdateObject(ctx, o) })
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Object(ctx, store.KindEgress, "p1", "e1")
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Spec) != "v2" || got.Revision != 2 || got.DrainSeconds != 30 || got.Labels["team"] != "b" ||
			got.LabelsRevision != 2 || got.Annotations["note"] != "a\nb" || got.AnnotationsRevision != 1 ||
			!got.CreatedAt.Equal(now) || !got.UpdatedAt.Equal(now.Add(time.Second)) || got.Deleted() {
			t.Errorf("object = %+v", got)
		}
		for _, sel := range []map[string]string{{"team": "a"}, {"team": "b"}} {
			list, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindEgress, ProjectID: "p1", Selector: sel, Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			if want := sel["team"] == "b"; (len(list) == 1) != want {
				t.Errorf("selector %v matched %d objects after relabel", sel, len(list))
			}
		}
		return nil
	})
	o.DeletedAt = now.Add(time.Minute)
	update(t, s, func(tx store.Tx) error { return tx.UpdateObject(ctx, o) })
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Object(ctx, store.KindEgress, "p1", "e1")
		if err != nil || !got.Deleted() || got.Labels["team"] != "b" {
			t.Errorf("deleted object = %+v, %v", got, err)
		}
		list, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindEgress, ProjectID: "p1", Limit: 10})
		if err != nil || len(list) != 0 {
			t.Errorf("list after delete = %v, %v", list, err)
		}
		// Deleted since a time, by kind.
		for _, c := range []struct {
			kind  store.Kind
			since time.Time
			want  []string
		}{
			{store.KindEgress, now, []string{"e1"}},
			{store.KindEgress, now.Add(time.Minute), nil},
			{store.KindResolver, now, nil},
		} {
			if got, err := tx.DeletedObjects(ctx, c.kind, c.since); err != nil || !slices.Equal(got, c.want) {
				t.Errorf("DeletedObjects(%s, %v) = %v, %v; want %v", c.kind, c.since, got, err, c.want)
			}
		}
		return nil
	})
	missing := object(store.KindEgress, "p1", "nope", nil)
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.UpdateObject(ctx, missing) }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update of missing object: %v", err)
	}
}

func testObjectScoping(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	update(t, s, func(tx store.Tx) error {
		return errors.Join(
			tx.CreateObject(ctx, object(store.KindEgress, "p1", "e1", nil)),
			tx.CreateObject(ctx, object(store.KindResolver, "p1", "r1", nil)),
			tx.CreateObject(ctx, object(store.KindEgress, "p2", "e2", nil)),
		)
	})
	view(t, s, func(tx store.Tx) error {
		if _, err := tx.Object(ctx, store.KindEgress, "p2", "e1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("object of another project: %v", err)
		}
		if _, err := tx.Object(ctx, store.KindResolver, "p1", "e1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("object of another kind: %v", err)
		}
		list, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindEgress, ProjectID: "p1", Limit: 10})
		if err != nil || len(list) != 1 || list[0].ID != "e1" {
			t.Errorf("egresses of p1 = %v, %v", list, err)
		}
		return nil
	})
}

func testListSelectorAndPages(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	var want []string
	update(t, s, func(tx store.Tx) error {
		for i := range 25 {
			labels := map[string]string{"tier": "web"}
			if i%3 == 0 {
				labels["env"] = "prod"
				want = append(want, fmt.Sprintf("e%02d", i))
			}
			if i%5 == 0 {
				labels["env"] = "dev"
				if i%3 == 0 {
					want = want[:len(want)-1]
				}
			}
			if err := tx.CreateObject(ctx, object(store.KindEgress, "p1", fmt.Sprintf("e%02d", i), labels)); err != nil {
				return err
			}
		}
		return nil
	})
	var got []string
	after := ""
	for {
		var page []store.Object
		view(t, s, func(tx store.Tx) error {
			var err error
			page, err = tx.Objects(ctx, store.ObjectQuery{Kind: store.KindEgress, ProjectID: "p1",
				Selector: map[string]string{"env": "prod", "tier": "web"}, After: after, Limit: 2})
			return err
		})
		for _, o := range page {
			got = append(got, o.ID)
			after = o.ID
		}
		if len(page) < 2 {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("paged selection = %v, want %v", got, want)
	}
}

func testPolicyReferences(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	eg := store.PolicyReference{Kind: store.RefEgress, TargetID: "e1"}
	udp := store.PolicyReference{Kind: store.RefEgressUDP, TargetID: "e1"}
	update(t, s, func(tx store.Tx) error {
		return errors.Join(
			tx.SetPolicyReferences(ctx, "p1", "w2", []store.PolicyReference{eg, eg, udp}),
			tx.SetPolicyReferences(ctx, "p1", "w1", []store.PolicyReference{eg}),
			tx.SetPolicyReferences(ctx, "p2", "w3", []store.PolicyReference{eg}),
		)
	})
	refs := func(ref store.PolicyReference, project string, limit int) []string {
		var ws []string
		view(t, s, func(tx store.Tx) error {
			var err error
			ws, err = tx.ReferencingWorkspaces(ctx, project, ref, limit)
			return err
		})
		return ws
	}
	if got := refs(eg, "p1", 10); !slices.Equal(got, []string{"w1", "w2"}) {
		t.Errorf("egress references = %v", got)
	}
	if got := refs(eg, "p1", 1); !slices.Equal(got, []string{"w1"}) {
		t.Errorf("limited references = %v", got)
	}
	if got := refs(udp, "p1", 10); !slices.Equal(got, []string{"w2"}) {
		t.Errorf("udp references = %v", got)
	}
	update(t, s, func(tx store.Tx) error { return tx.SetPolicyReferences(ctx, "p1", "w2", nil) })
	if got := refs(udp, "p1", 10); len(got) != 0 {
		t.Errorf("udp references after clearing = %v", got)
	}
	if got := refs(eg, "p1", 10); !slices.Equal(got, []string{"w1"}) {
		t.Errorf("egress references after clearing w2 = %v", got)
	}
}

func testRollback(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx store.Tx) error {
		if err := tx.CreateObject(ctx, object(store.KindEgress, "p1", "e1", map[string]string{"a": "b"})); err != nil {
			return err
		}
		if err := tx.PutCommand(ctx, store.Command{ProjectID: "p1", CommandID: "c", Method: "M", CreatedAt: now}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("update error = %v, want boom", err)
	}
	view(t, s, func(tx store.Tx) error {
		if _, err := tx.Object(ctx, store.KindEgress, "p1", "e1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("object survived rollback: %v", err)
		}
		if _, err := tx.Command(ctx, "p1", "c"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("command survived rollback: %v", err)
		}
		return nil
	})
}

// testConcurrentCAS races 50 read-compare-write transactions that all
// observed revision 1: exactly one may win.
func testConcurrentCAS(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	update(t, s, func(tx store.Tx) error { return tx.CreateObject(ctx, object(store.KindEgress, "p1", "e1", nil)) })
	errStale := errors.New("stale revision")
	var wins, stale atomic.Int32
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			err := s.Update(ctx, func(tx store.Tx) error {
				o, err := tx.Object(ctx, store.KindEgress, "p1", "e1")
				if err != nil {
					return err
				}
				if o.Revision != 1 {
					return errStale
				}
				o.Revision++
				o.Spec = fmt.Appendf(nil, "writer-%d", i)
				return tx.UpdateObject(ctx, o)
			})
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, errStale):
				stale.Add(1)
			default:
				t.Errorf("writer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 || stale.Load() != 49 {
		t.Errorf("wins = %d, stale = %d; want 1 and 49", wins.Load(), stale.Load())
	}
	view(t, s, func(tx store.Tx) error {
		o, err := tx.Object(ctx, store.KindEgress, "p1", "e1")
		if err != nil || o.Revision != 2 {
			t.Errorf("final object = %+v, %v", o, err)
		}
		return nil
	})
}

// testConcurrentSameCommand races transactions that each check for a
// command record and write one: the losers must end up seeing the winner's.
func testConcurrentSameCommand(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	responses := make([][]byte, 20)
	var wg sync.WaitGroup
	for i := range responses {
		wg.Go(func() {
			err := s.Update(ctx, func(tx store.Tx) error {
				c, err := tx.Command(ctx, "p1", "same")
				if err == nil {
					responses[i] = c.Response
					return nil
				}
				if !errors.Is(err, store.ErrNotFound) {
					return err
				}
				id := fmt.Sprintf("e%d", i)
				if err := tx.CreateObject(ctx, object(store.KindEgress, "p1", id, nil)); err != nil {
					return err
				}
				responses[i] = []byte(id)
				return tx.PutCommand(ctx, store.Command{ProjectID: "p1", CommandID: "same", Method: "M",
					Response: []byte(id), CreatedAt: now})
			})
			if err != nil {
				t.Errorf("command %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	view(t, s, func(tx store.Tx) error {
		list, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindEgress, ProjectID: "p1", Limit: 100})
		if err != nil || len(list) != 1 {
			t.Fatalf("objects created = %d, %v; want exactly 1", len(list), err)
		}
		for i, r := range responses {
			if string(r) != list[0].ID {
				t.Errorf("command %d saw response %q, want %q", i, r, list[0].ID)
			}
		}
		return nil
	})
}

// testLabelsOfMany: each of many workspaces of two projects on one host,
// one project holding more than one label query's worth, reads back with
// its own labels and no other's, a workspace without labels with none,
// through a host's list, by their IDs, a page of a project's and a read
// by ID.
func testLabelsOfMany(t *testing.T, s store.Store) {
	const n = 1040 // p1 gets more than a label query's 1,000
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	want := map[string]map[string]string{}
	update(t, s, func(tx store.Tx) error {
		for i := range n {
			project, id := "p1", fmt.Sprintf("w%04d", i)
			if i%40 == 0 {
				project = "p2"
			}
			labels := map[string]string{"n": strconv.Itoa(i), "project": project}
			if i%7 == 0 {
				labels = map[string]string{}
			}
			want[id] = labels
			if err := tx.CreateWorkspace(ctx, store.Workspace{ProjectID: project, ID: id, TemplateID: "base", Body: []byte(id),
				Labels: labels, HostID: "h1", CreatedAt: now, UpdatedAt: now}); err != nil {
				return err
			}
		}
		return nil
	})
	check := func(what string, got []store.Workspace) {
		t.Helper()
		for _, w := range got {
			if !maps.Equal(w.Labels, want[w.ID]) || w.Labels == nil {
				t.Errorf("%s: %s has labels %v, want %v", what, w.ID, w.Labels, want[w.ID])
			}
		}
	}
	view(t, s, func(tx store.Tx) error {
		all, err := tx.HostWorkspaces(ctx, "h1")
		if err != nil || len(all) != n {
			t.Fatalf("HostWorkspaces: %d, %v", len(all), err)
		}
		check("HostWorkspaces", all)
		ids := make([]string, 0, n)
		for _, w := range all {
			ids = append(ids, w.ID)
		}
		named, err := tx.HostWorkspacesByID(ctx, "h1", ids)
		if err != nil || len(named) != n {
			t.Fatalf("HostWorkspacesByID of all: %d, %v", len(named), err)
		}
		check("HostWorkspacesByID", named)
		page, err := tx.Workspaces(ctx, store.ObjectQuery{ProjectID: "p1", Limit: 50})
		if err != nil || len(page) != 50 {
			t.Fatalf("a page of p1: %d, %v", len(page), err)
		}
		check("a page of p1", page)
		one, err := tx.Workspace(ctx, "p2", "w0040")
		if err != nil {
			t.Fatal(err)
		}
		check("Workspace", []store.Workspace{one})
		return nil
	})
}

// testFarDeadlines: a deadline past what int64 nanoseconds hold (after
// 2262) is never due; one before 1678 always is.
func testFarDeadlines(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	far := store.Workspace{ProjectID: "p1", ID: "w-far", TemplateID: "base", Body: []byte("far"), HostID: "h1",
		ExpiresAt: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), CreatedAt: now, UpdatedAt: now}
	past := far
	past.ID, past.ExpiresAt = "w-past", time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.CreateWorkspace(ctx, far), tx.CreateWorkspace(ctx, past))
	})
	view(t, s, func(tx store.Tx) error {
		expired, err := tx.ExpiredWorkspaces(ctx, now.Add(100*365*24*time.Hour), 10)
		if err != nil || len(expired) != 1 || expired[0].ID != "w-past" {
			t.Errorf("expired a century on = %v, %v; want only w-past", expired, err)
		}
		return nil
	})
}

func testWorkspaces(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	ws := func(id string, labels map[string]string) store.Workspace {
		return store.Workspace{ProjectID: "p1", ID: id, TemplateID: "base", Body: []byte(id), Labels: labels,
			HostID: "h1", CPUMillis: 500, MemoryBytes: 256 << 20, LayerBytes: 1 << 30, Running: true,
			CreatedAt: now, UpdatedAt: now}
	}
	a := ws("w1", map[string]string{"env": "prod"})
	a.ExpiresAt = now.Add(time.Minute)
	b := ws("w2", map[string]string{"env": "dev"})
	b.HostID = "h2"
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.CreateWorkspace(ctx, a), tx.CreateWorkspace(ctx, b),
			tx.CreateWorkspace(ctx, ws("w3", nil)))
	})
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.CreateWorkspace(ctx, a) }); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate workspace: %v", err)
	}
	a.Body, a.Running, a.Labels = []byte("v2"), false, map[string]string{"env": "staging"}
	update(t, s, func(tx store.Tx) error { return tx.UpdateWorkspace(ctx, a) })
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Workspace(ctx, "p1", "w1")
		if err != nil || string(got.Body) != "v2" || got.Running || got.Labels["env"] != "staging" ||
			!got.ExpiresAt.Equal(now.Add(time.Minute)) || got.MemoryBytes != 256<<20 || got.LayerBytes != 1<<30 {
			t.Errorf("workspace = %+v, %v", got, err)
		}
		if _, err := tx.Workspace(ctx, "p2", "w1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("workspace of another project: %v", err)
		}
		sel, err := tx.Workspaces(ctx, store.ObjectQuery{ProjectID: "p1", Selector: map[string]string{"env": "staging"}, Limit: 10})
		if err != nil || len(sel) != 1 || sel[0].ID != "w1" {
			t.Errorf("selected workspaces = %v, %v", sel, err)
		}
		onH1, err := tx.HostWorkspaces(ctx, "h1")
		if err != nil || len(onH1) != 2 {
			t.Errorf("workspaces on h1 = %v, %v", onH1, err)
		}
		named, err := tx.HostWorkspacesByID(ctx, "h1", []string{"w3", "w2", "w1", "w9"})
		if err != nil || len(named) != 2 || named[0].ID != "w1" || named[1].ID != "w3" || named[0].Labels["env"] != "staging" {
			t.Errorf("workspaces on h1 among w3, w2, w1, w9 = %v, %v", named, err)
		}
		var want store.HostUsage
		for _, w := range onH1 {
			want.Workspaces++
			want.LayerBytes += w.LayerBytes
			if w.Running {
				want.CPUMillis += uint64(w.CPUMillis)
				want.MemoryBytes += w.MemoryBytes
			}
		}
		if got, err := tx.HostUsage(ctx, "h1"); err != nil || got != want || got.CPUMillis == 0 || got.MemoryBytes == 0 {
			t.Errorf("usage of h1 = %+v, %v; its workspaces hold %+v", got, err, want)
		}
		expired, err := tx.ExpiredWorkspaces(ctx, now.Add(time.Hour), 10)
		if err != nil || len(expired) != 1 || expired[0].ID != "w1" {
			t.Errorf("expired = %v, %v", expired, err)
		}
		if early, _ := tx.ExpiredWorkspaces(ctx, now, 10); len(early) != 0 {
			t.Errorf("expired before the deadline: %v", early)
		}
		users, err := tx.TemplateUsers(ctx, "p1", "base", 10)
		if err != nil || !slices.Equal(users, []string{"w1", "w2", "w3"}) {
			t.Errorf("template users = %v, %v", users, err)
		}
		return nil
	})
	b.DeletedAt = now
	update(t, s, func(tx store.Tx) error { return tx.UpdateWorkspace(ctx, b) })
	view(t, s, func(tx store.Tx) error {
		if got, _ := tx.HostWorkspaces(ctx, "h2"); len(got) != 0 {
			t.Errorf("deleted workspace still on its host: %v", got)
		}
		if got, _ := tx.HostWorkspacesByID(ctx, "h2", []string{"w2"}); len(got) != 0 {
			t.Errorf("deleted workspace still found on its host by ID: %v", got)
		}
		if got, err := tx.HostUsage(ctx, "h2"); err != nil || got != (store.HostUsage{}) {
			t.Errorf("usage of h2 after its one workspace was deleted = %+v, %v", got, err)
		}
		if users, _ := tx.TemplateUsers(ctx, "p1", "base", 10); len(users) != 2 {
			t.Errorf("deleted workspace still uses its template: %v", users)
		}
		if list, _ := tx.Workspaces(ctx, store.ObjectQuery{ProjectID: "p1", Selector: map[string]string{"env": "dev"}, Limit: 10}); len(list) != 0 {
			t.Errorf("deleted workspace listed: %v", list)
		}
		// By ID, the deleted one is found too.
		byID, err := tx.WorkspacesByID(ctx, []string{"w3", "w9", "w2", "w1"})
		if err != nil || len(byID) != 3 || byID[0].ID != "w1" || byID[1].ID != "w2" || byID[1].DeletedAt.IsZero() || byID[2].ID != "w3" {
			t.Errorf("workspaces w3, w9, w2, w1 by ID = %v, %v", byID, err)
		}
		return nil
	})
}

func testTemplatesAndHosts(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	r1 := store.TemplateRevision{ProjectID: "p1", TemplateID: "base", Revision: "sha256-1", Body: []byte("one"), CreatedAt: now}
	r2 := store.TemplateRevision{ProjectID: "p1", TemplateID: "base", Revision: "sha256-2", Body: []byte("two"), CreatedAt: now.Add(time.Second)}
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.PutTemplateRevision(ctx, r2), tx.PutTemplateRevision(ctx, r1))
	})
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.PutTemplateRevision(ctx, r1) }); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate revision: %v", err)
	}
	h := store.Host{ID: "h1", Body: []byte("x"), CPUMillis: 2000, MemoryBytes: 8 << 30, LayerBytes: 100 << 30, SeenAt: now}
	update(t, s, func(tx store.Tx) error { return tx.PutHost(ctx, h) })
	h.MemoryBytes = 16 << 30
	update(t, s, func(tx store.Tx) error { return tx.PutHost(ctx, h) })
	view(t, s, func(tx store.Tx) error {
		revs, err := tx.TemplateRevisions(ctx, "p1", "base")
		if err != nil || len(revs) != 2 || revs[0].Revision != "sha256-1" || string(revs[1].Body) != "two" {
			t.Errorf("revisions = %v, %v", revs, err)
		}
		hosts, err := tx.Hosts(ctx)
		if err != nil || len(hosts) != 1 || hosts[0].MemoryBytes != 16<<30 || hosts[0].CPUMillis != 2000 {
			t.Errorf("hosts = %v, %v", hosts, err)
		}
		return nil
	})
	// A lease that ran out and a drain survive a new registration.
	h.LostAt, h.Drained, h.SeenAt = now.Add(time.Minute), true, now.Add(time.Second)
	update(t, s, func(tx store.Tx) error { return tx.UpdateHost(ctx, h) })
	h.LostAt, h.Drained, h.SeenAt = time.Time{}, false, now.Add(2*time.Minute)
	update(t, s, func(tx store.Tx) error { return tx.PutHost(ctx, h) })
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.UpdateHost(ctx, store.Host{ID: "nope"}) }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update of an unknown host: %v", err)
	}
	view(t, s, func(tx store.Tx) error {
		hosts, err := tx.Hosts(ctx)
		if err != nil || len(hosts) != 1 || !hosts[0].LostAt.Equal(now.Add(time.Minute)) || !hosts[0].Drained ||
			!hosts[0].SeenAt.Equal(now.Add(2*time.Minute)) {
			t.Errorf("hosts = %+v, %v", hosts, err)
		}
		return nil
	})
}

func testLaunchRevisions(t *testing.T, s store.Store) {
	a := store.LaunchRevision{ID: "lr-a", Platform: "oci-runc/amd64", Body: []byte("a"), CreatedAt: now}
	b := store.LaunchRevision{ID: "lr-b", Platform: "oci-runc/amd64", Body: []byte("b"), CreatedAt: now}
	c := store.LaunchRevision{ID: "lr-c", Platform: "oci-crun/amd64", Body: []byte("c"), CreatedAt: now}
	put := func(l store.LaunchRevision, want bool) {
		t.Helper()
		update(t, s, func(tx store.Tx) error {
			created, err := tx.PutLaunchRevision(ctx, l)
			if created != want {
				t.Errorf("put %s: created %v, want %v", l.ID, created, want)
			}
			return err
		})
	}
	def := func(platform, want string, among ...string) {
		t.Helper()
		view(t, s, func(tx store.Tx) error {
			l, err := tx.NewestLaunchRevision(ctx, platform, among)
			if want == "" && !errors.Is(err, store.ErrNotFound) || want != "" && (err != nil || l.ID != want) {
				t.Errorf("default of %s = %+v, %v; want %q", platform, l, err, want)
			}
			return nil
		})
	}
	def("oci-runc/amd64", "")
	put(a, true)
	put(c, true)
	def("oci-runc/amd64", "lr-a")
	put(b, true)
	def("oci-runc/amd64", "lr-b")
	// A revision stored again changes nothing: not its body, not the default.
	a.Body = []byte("changed")
	put(a, false)
	def("oci-runc/amd64", "lr-b")
	def("oci-crun/amd64", "lr-c")
	// Among some: the newest of those, of the platform asked for.
	def("oci-runc/amd64", "lr-a", "lr-a", "lr-c", "lr-none")
	def("oci-runc/amd64", "lr-b", "lr-b", "lr-a")
	def("oci-runc/amd64", "", "lr-c", "lr-none")
	view(t, s, func(tx store.Tx) error {
		l, err := tx.LaunchRevision(ctx, "lr-a")
		if err != nil || string(l.Body) != "a" || l.Platform != "oci-runc/amd64" || !l.CreatedAt.Equal(now) {
			t.Errorf("lr-a = %+v, %v", l, err)
		}
		if _, err := tx.LaunchRevision(ctx, "lr-none"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown revision: %v", err)
		}
		return nil
	})
}

func testHostTokens(t *testing.T, s store.Store) {
	a := store.HostToken{ID: "ht1", Name: "rack 1", SecretHash: []byte("hash"), CreatedAt: now, HostIDs: []string{"rack-1-a", "rack-1-b"}}
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.CreateHostToken(ctx, store.HostToken{ID: "ht2", SecretHash: []byte("h2"), CreatedAt: now, AnyHost: true}), tx.CreateHostToken(ctx, a))
	})
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.CreateHostToken(ctx, a) }); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate host token: %v", err)
	}
	update(t, s, func(tx store.Tx) error { return tx.RevokeHostToken(ctx, "ht1", now.Add(time.Hour)) })
	update(t, s, func(tx store.Tx) error { return tx.RevokeHostToken(ctx, "ht1", now.Add(2*time.Hour)) })
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.RevokeHostToken(ctx, "nope", now) }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoking an unknown host token: %v", err)
	}
	view(t, s, func(tx store.Tx) error {
		got, err := tx.HostToken(ctx, "ht1")
		if err != nil || got.Name != "rack 1" || string(got.SecretHash) != "hash" || !got.RevokedAt.Equal(now.Add(time.Hour)) ||
			!slices.Equal(got.HostIDs, a.HostIDs) || got.AnyHost {
			t.Errorf("host token = %+v, %v", got, err)
		}
		if _, err := tx.HostToken(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown host token: %v", err)
		}
		all, err := tx.HostTokens(ctx)
		if err != nil || len(all) != 2 || all[0].ID != "ht1" || !all[1].RevokedAt.IsZero() ||
			!slices.Equal(all[0].HostIDs, a.HostIDs) || len(all[1].HostIDs) != 0 || !all[1].AnyHost {
			t.Errorf("host tokens = %+v, %v", all, err)
		}
		return nil
	})
}

func testSessions(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	ses := func(project, id string, expires time.Time) store.Session {
		return store.Session{ProjectID: project, ID: id, WorkspaceID: "w-" + id, Generation: 3, ExpiresAt: expires, CreatedAt: now, TokenID: "tok-" + project}
	}
	a := ses("p1", "s1", now.Add(time.Hour))
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.CreateSession(ctx, a), tx.CreateSession(ctx, ses("p1", "s2", now.Add(time.Minute))),
			tx.CreateSession(ctx, ses("p2", "s3", now.Add(2*time.Minute))), tx.CreateSession(ctx, ses("p2", "s1", now.Add(3*time.Minute))))
	})
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.CreateSession(ctx, a) }); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate session: %v", err)
	}
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Session(ctx, "p1", "s1")
		if err != nil || got != a {
			t.Errorf("session = %+v, %v; want %+v", got, err, a)
		}
		if _, err := tx.Session(ctx, "p1", "s3"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("session of another project: %v", err)
		}
		return nil
	})
	// A token's sessions, those expiring after a time.
	view(t, s, func(tx store.Tx) error {
		for _, c := range []struct {
			token string
			after time.Time
			want  []string
		}{
			{"tok-p1", now, []string{"p1/s1", "p1/s2"}},
			{"tok-p1", now.Add(2 * time.Minute), []string{"p1/s1"}},
			{"tok-p2", now, []string{"p2/s1", "p2/s3"}},
			{"tok-none", now, nil},
		} {
			got, err := tx.TokenSessions(ctx, c.token, c.after)
			var ids []string
			for _, g := range got {
				if g.TokenID != c.token {
					t.Errorf("TokenSessions(%s) gave a session of token %s", c.token, g.TokenID)
				}
				ids = append(ids, g.ProjectID+"/"+g.ID)
			}
			if err != nil || !slices.Equal(ids, c.want) {
				t.Errorf("TokenSessions(%s, %v) = %v, %v; want %v", c.token, c.after, ids, err, c.want)
			}
		}
		return nil
	})
	// Deleting is bounded, oldest first, and keeps unexpired sessions.
	var n int
	update(t, s, func(tx store.Tx) (err error) {
		n, err = tx.DeleteSessions(ctx, now.Add(150*time.Second), 1)
		return err
	})
	if n != 1 {
		t.Errorf("deleted %d sessions, want 1", n)
	}
	update(t, s, func(tx store.Tx) (err error) {
		n, err = tx.DeleteSessions(ctx, now.Add(150*time.Second), 10)
		return err
	})
	if n != 1 {
		t.Errorf("deleted %d sessions, want 1", n)
	}
	view(t, s, func(tx store.Tx) error {
		for _, k := range []struct {
			project, id string
			live        bool
		}{{"p1", "s1", true}, {"p1", "s2", false}, {"p2", "s3", false}, {"p2", "s1", true}} {
			_, err := tx.Session(ctx, k.project, k.id)
			if (err == nil) != k.live {
				t.Errorf("session %s/%s after deleting expired: %v", k.project, k.id, err)
			}
		}
		return nil
	})
}

func volume(project, id, host, pool string, labels map[string]string) store.Volume {
	return store.Volume{ProjectID: project, ID: id, Body: []byte("body-" + id), Labels: labels,
		HostID: host, Pool: pool, CreatedAt: now, UpdatedAt: now}
}

// sameVolume reports whether got is want as stored: nil and empty labels
// are alike.
func sameVolume(got, want store.Volume) bool {
	return got.ProjectID == want.ProjectID && got.ID == want.ID && bytes.Equal(got.Body, want.Body) &&
		maps.Equal(got.Labels, want.Labels) && got.HostID == want.HostID && got.Pool == want.Pool &&
		got.WorkspaceID == want.WorkspaceID && got.CreatedAt.Equal(want.CreatedAt) &&
		got.UpdatedAt.Equal(want.UpdatedAt) && got.DeletedAt.Equal(want.DeletedAt)
}

// idsOf returns id of each row, in order.
func idsOf[T any](rows []T, id func(T) string) []string {
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = id(r)
	}
	return ids
}

func volumeIDs(vs []store.Volume) []string {
	return idsOf(vs, func(v store.Volume) string { return v.ID })
}

func testVolumeLifecycle(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	v := volume("p1", "v1", "h1", "fast", map[string]string{"env": "prod", "team": "a"})
	v.WorkspaceID = "w1"
	update(t, s, func(tx store.Tx) error { return tx.CreateVolume(ctx, v) })
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.CreateVolume(ctx, v) }); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate volume: %v", err)
	}
	if err := s.Update(ctx, func(tx store.Tx) error {
		return tx.CreateVolume(ctx, volume("p2", "v1", "h1", "fast", nil))
	}); !errors.Is(err, store.ErrExists) {
		t.Errorf("volume ID taken in another project: %v", err)
	}
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Volume(ctx, "p1", "v1")
		if err != nil || !sameVolume(got, v) {
			t.Errorf("volume = %+v, %v; want %+v", got, err, v)
		}
		if _, err := tx.Volume(ctx, "p2", "v1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("volume of another project: %v", err)
		}
		return nil
	})

	// Every mutable field changes; CreatedAt stays.
	v.Body, v.Labels = []byte("v2"), map[string]string{"env": "dev"}
	v.HostID, v.Pool, v.WorkspaceID = "h2", "slow", ""
	v.UpdatedAt = now.Add(time.Second)
	changed := v
	changed.CreatedAt = now.Add(time.Hour)
	update(t, s, func(tx store.Tx) error { return tx.UpdateVolume(ctx, changed) })
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Volume(ctx, "p1", "v1")
		if err != nil || !sameVolume(got, v) {
			t.Errorf("updated volume = %+v, %v; want %+v", got, err, v)
		}
		for _, sel := range []map[string]string{{"env": "prod"}, {"team": "a"}, {"env": "dev"}} {
			list, err := tx.Volumes(ctx, store.ObjectQuery{ProjectID: "p1", Selector: sel, Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			if want := sel["env"] == "dev"; (len(list) == 1) != want {
				t.Errorf("selector %v matched %d volumes after relabel", sel, len(list))
			}
		}
		return nil
	})
	missing := volume("p1", "nope", "h1", "fast", nil)
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.UpdateVolume(ctx, missing) }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update of missing volume: %v", err)
	}
	other := v
	other.ProjectID = "p2"
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.UpdateVolume(ctx, other) }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update of a volume through another project: %v", err)
	}

	// A deleted volume is still read, labels included, but never listed.
	v.DeletedAt = now.Add(time.Minute)
	update(t, s, func(tx store.Tx) error { return tx.UpdateVolume(ctx, v) })
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Volume(ctx, "p1", "v1")
		if err != nil || !sameVolume(got, v) || got.Labels["env"] != "dev" {
			t.Errorf("deleted volume = %+v, %v; want %+v", got, err, v)
		}
		for _, sel := range []map[string]string{nil, {"env": "dev"}} {
			if list, err := tx.Volumes(ctx, store.ObjectQuery{ProjectID: "p1", Selector: sel, Limit: 10}); err != nil || len(list) != 0 {
				t.Errorf("volumes selected by %v after delete = %v, %v", sel, volumeIDs(list), err)
			}
		}
		if list, err := tx.HostVolumes(ctx, "h2"); err != nil || len(list) != 0 {
			t.Errorf("deleted volume still on its host: %v, %v", volumeIDs(list), err)
		}
		if list, err := tx.PoolVolumes(ctx, "slow"); err != nil || len(list) != 0 {
			t.Errorf("deleted volume still in its pool: %v, %v", volumeIDs(list), err)
		}
		return nil
	})
}

func testVolumeLists(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	prod, dev := map[string]string{"env": "prod"}, map[string]string{"env": "dev"}
	vs := []store.Volume{
		volume("p2", "v00", "h1", "fast", prod),
		volume("p1", "v01", "h1", "fast", prod),
		volume("p1", "v02", "h2", "fast", prod),
		volume("p1", "v03", "h1", "slow", dev),
		volume("p1", "v04", "h1", "fast", prod),
		volume("p1", "v05", "", "slow", prod),
		volume("p1", "v06", "h2", "fast", prod),
		volume("p2", "v07", "h1", "fast", prod),
		volume("p2", "v08", "h1", "slow", prod),
		volume("p2", "v09", "h2", "fast", nil),
	}
	update(t, s, func(tx store.Tx) error {
		// Out of order, so that lists must sort.
		for _, i := range []int{9, 3, 0, 6, 1, 8, 4, 2, 7, 5} {
			if err := tx.CreateVolume(ctx, vs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		for _, i := range []int{4, 8} {
			vs[i].DeletedAt = now
			if err := tx.UpdateVolume(ctx, vs[i]); err != nil {
				return err
			}
		}
		return nil
	})

	page := func(sel map[string]string) []string {
		var got []string
		after := ""
		for {
			var list []store.Volume
			view(t, s, func(tx store.Tx) error {
				var err error
				list, err = tx.Volumes(ctx, store.ObjectQuery{ProjectID: "p1", Selector: sel, After: after, Limit: 2})
				return err
			})
			for _, v := range list {
				got = append(got, v.ID)
				after = v.ID
			}
			if len(list) < 2 {
				return got
			}
		}
	}
	if got, want := page(nil), []string{"v01", "v02", "v03", "v05", "v06"}; !slices.Equal(got, want) {
		t.Errorf("paged volumes = %v, want %v", got, want)
	}
	if got, want := page(prod), []string{"v01", "v02", "v05", "v06"}; !slices.Equal(got, want) {
		t.Errorf("paged volumes with env=prod = %v, want %v", got, want)
	}

	view(t, s, func(tx store.Tx) error {
		for _, c := range []struct {
			name string
			list func(context.Context, string) ([]store.Volume, error)
			key  string
			want []string
		}{
			{"host", tx.HostVolumes, "h1", []string{"v00", "v01", "v03", "v07"}},
			{"host", tx.HostVolumes, "h2", []string{"v02", "v06", "v09"}},
			{"host", tx.HostVolumes, "h3", nil},
			{"pool", tx.PoolVolumes, "fast", []string{"v00", "v01", "v02", "v06", "v07", "v09"}},
			{"pool", tx.PoolVolumes, "slow", []string{"v03", "v05"}},
			{"pool", tx.PoolVolumes, "none", nil},
		} {
			got, err := c.list(ctx, c.key)
			if err != nil || !slices.Equal(volumeIDs(got), c.want) {
				t.Errorf("volumes of %s %s = %v, %v; want %v", c.name, c.key, volumeIDs(got), err, c.want)
				continue
			}
			// Rows come whole, labels included.
			for _, v := range got {
				i := slices.IndexFunc(vs, func(w store.Volume) bool { return w.ID == v.ID })
				if !sameVolume(v, vs[i]) {
					t.Errorf("volume listed by %s %s = %+v, want %+v", c.name, c.key, v, vs[i])
				}
			}
		}
		return nil
	})
}

func testVolumeRollback(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	v := volume("p1", "v1", "h1", "fast", map[string]string{"env": "prod"})
	update(t, s, func(tx store.Tx) error { return tx.CreateVolume(ctx, v) })
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx store.Tx) error {
		changed := v
		changed.Body, changed.Labels = []byte("v2"), map[string]string{"env": "dev"}
		changed.HostID, changed.Pool, changed.WorkspaceID = "h2", "slow", "w1"
		changed.UpdatedAt, changed.DeletedAt = now.Add(time.Second), now.Add(time.Second)
		if err := tx.UpdateVolume(ctx, changed); err != nil {
			return err
		}
		if err := tx.CreateVolume(ctx, volume("p1", "v2", "h1", "fast", nil)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("update error = %v, want boom", err)
	}
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Volume(ctx, "p1", "v1")
		if err != nil || !sameVolume(got, v) {
			t.Errorf("volume after rollback = %+v, %v; want %+v", got, err, v)
		}
		if _, err := tx.Volume(ctx, "p1", "v2"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("volume survived rollback: %v", err)
		}
		list, err := tx.Volumes(ctx, store.ObjectQuery{ProjectID: "p1", Selector: map[string]string{"env": "prod"}, Limit: 10})
		if err != nil || !slices.Equal(volumeIDs(list), []string{"v1"}) {
			t.Errorf("labels after rollback select %v, %v", volumeIDs(list), err)
		}
		if got, err := tx.HostVolumes(ctx, "h1"); err != nil || !slices.Equal(volumeIDs(got), []string{"v1"}) {
			t.Errorf("volumes of host h1 after rollback = %v, %v", volumeIDs(got), err)
		}
		if got, err := tx.PoolVolumes(ctx, "fast"); err != nil || !slices.Equal(volumeIDs(got), []string{"v1"}) {
			t.Errorf("volumes of pool fast after rollback = %v, %v", volumeIDs(got), err)
		}
		return nil
	})
}

func exposureIDs(es []store.Exposure) []string {
	return idsOf(es, func(e store.Exposure) string { return e.ID })
}

func testExposures(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	exp := func(project, id, workspace string, port uint32, persistent bool) store.Exposure {
		return store.Exposure{ProjectID: project, ID: id, WorkspaceID: workspace, Port: port, Persistent: persistent,
			Body: []byte("body-" + id), CreatedAt: now}
	}
	a := exp("p1", "e1", "w1", 8080, false)
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.CreateExposure(ctx, a), tx.CreateExposure(ctx, exp("p1", "e2", "w1", 3000, true)),
			tx.CreateExposure(ctx, exp("p1", "e3", "w1", 22, false)), tx.CreateExposure(ctx, exp("p1", "e4", "w2", 8080, false)),
			tx.CreateExposure(ctx, exp("p2", "e5", "w3", 8080, false)))
	})
	for name, dup := range map[string]store.Exposure{
		"same ID":                exp("p1", "e1", "w9", 1, false),
		"live port of workspace": exp("p1", "e6", "w1", 8080, true),
	} {
		if err := s.Update(ctx, func(tx store.Tx) error { return tx.CreateExposure(ctx, dup) }); !errors.Is(err, store.ErrExists) {
			t.Errorf("%s: %v, want ErrExists", name, err)
		}
	}
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Exposure(ctx, "p1", "e1")
		if err != nil || got.ID != a.ID || got.WorkspaceID != a.WorkspaceID || got.Port != a.Port || got.Persistent ||
			string(got.Body) != string(a.Body) || !got.CreatedAt.Equal(now) || !got.EndedAt.IsZero() {
			t.Errorf("exposure = %+v, %v; want %+v", got, err, a)
		}
		if _, err := tx.Exposure(ctx, "p2", "e1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("exposure of another project: %v", err)
		}
		all, err := tx.WorkspaceExposures(ctx, "p1", "w1", "", 0)
		if got := exposureIDs(all); err != nil || !slices.Equal(got, []string{"e1", "e2", "e3"}) {
			t.Errorf("workspace exposures = %v, %v", got, err)
		}
		page, err := tx.WorkspaceExposures(ctx, "p1", "w1", "e1", 1)
		if got := exposureIDs(page); err != nil || !slices.Equal(got, []string{"e2"}) {
			t.Errorf("page after e1 = %v, %v", got, err)
		}
		if other, err := tx.WorkspaceExposures(ctx, "p2", "w1", "", 0); err != nil || len(other) != 0 {
			t.Errorf("workspace exposures in another project = %v, %v", exposureIDs(other), err)
		}
		return nil
	})
	// A host's exposures: those of its workspaces that are not deleted, of
	// the workspace's own project.
	place := func(project, id, host string, deleted bool) store.Workspace {
		w := store.Workspace{ProjectID: project, ID: id, TemplateID: "base", Body: []byte(id), HostID: host,
			CreatedAt: now, UpdatedAt: now}
		if deleted {
			w.DeletedAt = now
		}
		return w
	}
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.CreateWorkspace(ctx, place("p1", "w1", "h1", false)), tx.CreateWorkspace(ctx, place("p1", "w2", "h2", false)),
			tx.CreateWorkspace(ctx, place("p2", "w3", "h1", false)), tx.CreateWorkspace(ctx, place("p1", "w4", "h1", true)),
			tx.CreateExposure(ctx, exp("p1", "e7", "w4", 1, false)), tx.CreateExposure(ctx, exp("p2", "e8", "w1", 1, false)))
	})
	view(t, s, func(tx store.Tx) error {
		for host, want := range map[string][]string{"h1": {"e1", "e2", "e3", "e5"}, "h2": {"e4"}, "h3": nil} {
			got, err := tx.HostExposures(ctx, host)
			if ids := exposureIDs(got); err != nil || !slices.Equal(ids, want) {
				t.Errorf("exposures on %s = %v, %v; want %v", host, ids, err, want)
			}
		}
		return nil
	})
	// Ending one frees its port for a new exposure; ending again keeps the
	// first time.
	update(t, s, func(tx store.Tx) error {
		return errors.Join(tx.EndExposure(ctx, "p1", "e1", now), tx.EndExposure(ctx, "p1", "e1", now.Add(time.Hour)),
			tx.CreateExposure(ctx, exp("p1", "e6", "w1", 8080, false)))
	})
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.EndExposure(ctx, "p2", "e1", now) }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ending another project's exposure: %v", err)
	}
	view(t, s, func(tx store.Tx) error {
		got, err := tx.Exposure(ctx, "p1", "e1")
		if err != nil || !got.EndedAt.Equal(now) {
			t.Errorf("ended exposure = %+v, %v", got, err)
		}
		return nil
	})
	// The execution ends: the persistent exposure stays; then the workspace
	// goes: it ends too. Other workspaces keep theirs.
	var n int
	update(t, s, func(tx store.Tx) (err error) {
		n, err = tx.EndWorkspaceExposures(ctx, "p1", "w1", false, now)
		return err
	})
	if n != 2 {
		t.Errorf("ended %d exposures with the execution, want 2", n)
	}
	view(t, s, func(tx store.Tx) error {
		live, err := tx.WorkspaceExposures(ctx, "p1", "w1", "", 0)
		if got := exposureIDs(live); err != nil || !slices.Equal(got, []string{"e2"}) {
			t.Errorf("live after the execution ended = %v, %v", got, err)
		}
		return nil
	})
	update(t, s, func(tx store.Tx) (err error) {
		n, err = tx.EndWorkspaceExposures(ctx, "p1", "w1", true, now)
		return err
	})
	if n != 1 {
		t.Errorf("ended %d exposures with the workspace, want 1", n)
	}
	view(t, s, func(tx store.Tx) error {
		for _, k := range []struct{ project, workspace string }{{"p1", "w1"}, {"p1", "w2"}, {"p2", "w3"}} {
			live, err := tx.WorkspaceExposures(ctx, k.project, k.workspace, "", 0)
			if want := k.workspace != "w1"; err != nil || (len(live) == 1) != want {
				t.Errorf("live exposures of %s/%s = %v, %v", k.project, k.workspace, exposureIDs(live), err)
			}
		}
		return nil
	})
}
