package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// testPruneDeleted prunes what ended before a cut, in batches: the rows
// of resources deleted, exposures ended and tokens revoked before it go
// with the rows keyed by their IDs; those that ended after it, live rows,
// projects and hosts stay.
func testPruneDeleted(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	cut := now.Add(-time.Hour)
	old, older, recent := cut.Add(-time.Minute), cut.Add(-2*time.Minute), cut.Add(time.Minute)
	labels := map[string]string{"team": "a"}
	ws := func(id string, deleted time.Time) store.Workspace {
		return store.Workspace{ProjectID: "p1", ID: id, Labels: labels, CreatedAt: now, UpdatedAt: now, DeletedAt: deleted}
	}
	deletedVolume := func(id string, at time.Time) store.Volume {
		v := volume("p1", id, "", "default", labels)
		v.DeletedAt = at
		return v
	}
	deletedTransfer := func(id string, at time.Time) store.Transfer {
		tr := transfer("p1", id, labels)
		tr.DeletedAt = at
		return tr
	}
	deletedObject := func(kind store.Kind, id string, at time.Time) store.Object {
		o := object(kind, "p1", id, labels)
		o.DeletedAt = at
		return o
	}
	update(t, s, func(tx store.Tx) error {
		for _, w := range []store.Workspace{ws("ws_old", old), ws("ws_recent", recent), ws("ws_live", time.Time{})} {
			if err := tx.CreateWorkspace(ctx, w); err != nil {
				return err
			}
			// Sessions and exposures name their workspace; those of a
			// pruned workspace go with it, ended or not.
			if err := tx.CreateSession(ctx, store.Session{ProjectID: "p1", ID: "ses_" + w.ID, WorkspaceID: w.ID,
				ExpiresAt: now.Add(time.Hour), CreatedAt: now}); err != nil {
				return err
			}
			if err := tx.CreateExposure(ctx, store.Exposure{ProjectID: "p1", ID: "exp_" + w.ID, WorkspaceID: w.ID,
				Port: 80, CreatedAt: now, EndedAt: w.DeletedAt}); err != nil {
				return err
			}
		}
		if err := tx.SetPolicyReferences(ctx, "p1", "ws_old", []store.PolicyReference{{Kind: store.RefEgress, TargetID: "eg_live"}}); err != nil {
			return err
		}
		for _, e := range []store.Exposure{
			{ProjectID: "p1", ID: "exp_ended_old", WorkspaceID: "ws_live", Port: 81, CreatedAt: now, EndedAt: old},
			{ProjectID: "p1", ID: "exp_ended_recent", WorkspaceID: "ws_live", Port: 82, CreatedAt: now, EndedAt: recent},
		} {
			if err := tx.CreateExposure(ctx, e); err != nil {
				return err
			}
		}
		for _, v := range []store.Volume{deletedVolume("vol_older", older), deletedVolume("vol_old", old),
			deletedVolume("vol_recent", recent), deletedVolume("vol_live", time.Time{})} {
			if err := tx.CreateVolume(ctx, v); err != nil {
				return err
			}
		}
		for _, tr := range []store.Transfer{deletedTransfer("tr_old", old), deletedTransfer("tr_recent", recent),
			deletedTransfer("tr_live", time.Time{})} {
			if err := tx.CreateTransfer(ctx, tr); err != nil {
				return err
			}
		}
		for _, o := range []store.Object{deletedObject(store.KindEgress, "eg_old", old), deletedObject(store.KindEgress, "eg_live", time.Time{}),
			deletedObject(store.KindTemplate, "tpl-old", old), deletedObject(store.KindTemplate, "tpl-recent", recent)} {
			if err := tx.CreateObject(ctx, o); err != nil {
				return err
			}
		}
		for _, id := range []string{"tpl-old", "tpl-recent"} {
			if err := tx.PutTemplateRevision(ctx, store.TemplateRevision{ProjectID: "p1", TemplateID: id, Revision: "r1", CreatedAt: now}); err != nil {
				return err
			}
		}
		for id, revoked := range map[string]time.Time{"tok_old": old, "tok_recent": recent, "tok_live": {}} {
			if err := tx.CreateToken(ctx, store.Token{ID: id, ProjectID: "p1", Role: "admin", CreatedAt: now, RevokedAt: revoked}); err != nil {
				return err
			}
			if err := tx.CreateHostToken(ctx, store.HostToken{ID: "h" + id, CreatedAt: now, RevokedAt: revoked, AnyHost: true}); err != nil {
				return err
			}
		}
		return tx.PutHost(ctx, store.Host{ID: "h1", SeenAt: now, TokenID: "htok_old"})
	})
	// A read by ID may keep the row in memory: pruning must drop it.
	viewCached(t, s, func(tx store.Tx) error {
		_, err := tx.Workspace(ctx, "p1", "ws_old")
		return err
	})

	prune := func(limit int) int {
		var n int
		update(t, s, func(tx store.Tx) error {
			var err error
			n, err = tx.PruneDeleted(ctx, cut, limit)
			return err
		})
		return n
	}
	// Nine rows ended before the cut: a workspace, two volumes, a
	// transfer, two objects, an exposure, a token and a host token, at most
	// two a batch, kind after kind and oldest first.
	if n := prune(2); n != 2 {
		t.Fatalf("first batch pruned %d rows, want 2", n)
	}
	view(t, s, func(tx store.Tx) error {
		if _, err := tx.Volume(ctx, "p1", "vol_older"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the volume deleted first, after the first batch: %v, want ErrNotFound", err)
		}
		if _, err := tx.Volume(ctx, "p1", "vol_old"); err != nil {
			t.Errorf("the volume deleted second, after the first batch: %v; want it left for the next", err)
		}
		return nil
	})
	for _, want := range []int{2, 2, 2, 1, 0} {
		if n := prune(2); n != want {
			t.Errorf("next batch pruned %d rows, want %d", n, want)
		}
	}

	gone := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s ended before the cut: %v, want ErrNotFound", what, err)
		}
	}
	kept := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v, want it kept", what, err)
		}
	}
	viewCached(t, s, func(tx store.Tx) error {
		_, err := tx.Workspace(ctx, "p1", "ws_old")
		gone("a workspace read from memory", err)
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		_, err := tx.Workspace(ctx, "p1", "ws_old")
		gone("a workspace", err)
		_, err = tx.Session(ctx, "p1", "ses_ws_old")
		gone("the session of a pruned workspace", err)
		_, err = tx.Exposure(ctx, "p1", "exp_ws_old")
		gone("the exposure of a pruned workspace", err)
		refs, err := tx.ReferencingWorkspaces(ctx, "p1", store.PolicyReference{Kind: store.RefEgress, TargetID: "eg_live"}, 10)
		if err != nil || len(refs) != 0 {
			t.Errorf("policy references of a pruned workspace: %v, %v; want none", refs, err)
		}
		_, err = tx.Volume(ctx, "p1", "vol_old")
		gone("a volume", err)
		_, err = tx.Transfer(ctx, "p1", "tr_old")
		gone("a transfer", err)
		_, err = tx.Object(ctx, store.KindEgress, "p1", "eg_old")
		gone("an egress", err)
		_, err = tx.Object(ctx, store.KindTemplate, "p1", "tpl-old")
		gone("a template", err)
		if revs, err := tx.TemplateRevisions(ctx, "p1", "tpl-old"); err != nil || len(revs) != 0 {
			t.Errorf("revisions of a pruned template: %v, %v; want none", revs, err)
		}
		if deleted, err := tx.DeletedObjects(ctx, store.KindEgress, time.Time{}); err != nil || len(deleted) != 0 {
			t.Errorf("deleted egresses after pruning: %v, %v; want none", deleted, err)
		}
		_, err = tx.Exposure(ctx, "p1", "exp_ended_old")
		gone("an exposure", err)
		_, err = tx.Token(ctx, "tok_old")
		gone("a token", err)
		_, err = tx.HostToken(ctx, "htok_old")
		gone("a host token", err)

		for _, id := range []string{"ws_recent", "ws_live"} {
			_, err = tx.Workspace(ctx, "p1", id)
			kept(id, err)
			_, err = tx.Session(ctx, "p1", "ses_"+id)
			kept("the session of "+id, err)
			_, err = tx.Exposure(ctx, "p1", "exp_"+id)
			kept("the exposure of "+id, err)
		}
		for _, id := range []string{"vol_recent", "vol_live"} {
			v, err := tx.Volume(ctx, "p1", id)
			kept(id, err)
			if v.Labels["team"] != "a" {
				t.Errorf("labels of %s = %v, want them kept", id, v.Labels)
			}
		}
		for _, id := range []string{"tr_recent", "tr_live"} {
			_, err = tx.Transfer(ctx, "p1", id)
			kept(id, err)
		}
		_, err = tx.Object(ctx, store.KindEgress, "p1", "eg_live")
		kept("a live egress", err)
		_, err = tx.Object(ctx, store.KindTemplate, "p1", "tpl-recent")
		kept("a template deleted after the cut", err)
		if revs, err := tx.TemplateRevisions(ctx, "p1", "tpl-recent"); err != nil || len(revs) != 1 {
			t.Errorf("revisions of a template deleted after the cut: %v, %v; want one", revs, err)
		}
		_, err = tx.Exposure(ctx, "p1", "exp_ended_recent")
		kept("an exposure ended after the cut", err)
		for _, id := range []string{"tok_recent", "tok_live"} {
			_, err = tx.Token(ctx, id)
			kept(id, err)
			_, err = tx.HostToken(ctx, "h"+id)
			kept("h"+id, err)
		}
		if live, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindEgress, ProjectID: "p1", Selector: labels, Limit: 10}); err != nil ||
			!slices.EqualFunc(live, []string{"eg_live"}, func(o store.Object, id string) bool { return o.ID == id }) {
			t.Errorf("egresses labeled team=a: %v, %v; want eg_live's labels kept", live, err)
		}
		if p, err := tx.Project(ctx, "p1"); err != nil || p.ID != "p1" {
			t.Errorf("project: %+v, %v; want it kept", p, err)
		}
		hosts, err := tx.Hosts(ctx)
		if err != nil || len(hosts) != 1 || hosts[0].TokenID != "htok_old" {
			t.Errorf("hosts: %+v, %v; want h1 kept as it registered", hosts, err)
		}
		return nil
	})

	// The label rows of a pruned volume and transfer went with them: the
	// same IDs created again carry none.
	update(t, s, func(tx store.Tx) error {
		if err := tx.CreateVolume(ctx, volume("p1", "vol_old", "", "default", nil)); err != nil {
			return err
		}
		return tx.CreateTransfer(ctx, transfer("p1", "tr_old", nil))
	})
	view(t, s, func(tx store.Tx) error {
		if v, err := tx.Volume(ctx, "p1", "vol_old"); err != nil || len(v.Labels) != 0 {
			t.Errorf("a volume created with a pruned one's ID: labels %v, %v; want none", v.Labels, err)
		}
		if tr, err := tx.Transfer(ctx, "p1", "tr_old"); err != nil || len(tr.Labels) != 0 {
			t.Errorf("a transfer created with a pruned one's ID: labels %v, %v; want none", tr.Labels, err)
		}
		return nil
	})
}
