package storetest

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

func transfer(project, id string, labels map[string]string) store.Transfer {
	return store.Transfer{ProjectID: project, ID: id, Body: []byte("body-" + id), Labels: labels,
		CreatedAt: now, UpdatedAt: now}
}

// sameTransfer reports whether got is want as stored: nil and empty labels
// are alike.
func sameTransfer(got, want store.Transfer) bool {
	return got.ProjectID == want.ProjectID && got.ID == want.ID && bytes.Equal(got.Body, want.Body) &&
		maps.Equal(got.Labels, want.Labels) && got.HostID == want.HostID && got.Pending == want.Pending &&
		got.ExpiresAt.Equal(want.ExpiresAt) && got.CreatedAt.Equal(want.CreatedAt) &&
		got.UpdatedAt.Equal(want.UpdatedAt) && got.DeletedAt.Equal(want.DeletedAt)
}

func transferIDs(ts []store.Transfer) []string {
	return idsOf(ts, func(tr store.Transfer) string { return tr.ID })
}

// testTransfers covers a transfer's row through its life: create, read
// scoped by project, every mutable field updated, the host, pending and
// expiry queries across projects, pages and selectors, and a deleted
// transfer that is read with its labels but never listed.
func testTransfers(t *testing.T, s store.Store) {
	mustProject(t, s, "p1")
	mustProject(t, s, "p2")
	a := transfer("p1", "t1", map[string]string{"env": "prod"})
	a.HostID, a.Pending = "h1", true
	b := transfer("p1", "t2", map[string]string{"env": "dev"})
	b.ExpiresAt = now.Add(time.Hour)
	c := transfer("p2", "t3", nil)
	c.Pending, c.ExpiresAt = true, now.Add(-time.Minute)
	update(t, s, func(tx store.Tx) error {
		for _, tr := range []store.Transfer{c, a, b} {
			if err := tx.CreateTransfer(ctx, tr); err != nil {
				return err
			}
		}
		return nil
	})
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.CreateTransfer(ctx, transfer("p2", "t1", nil)) }); !errors.Is(err, store.ErrExists) {
		t.Errorf("transfer ID taken in another project: %v", err)
	}
	view(t, s, func(tx store.Tx) error {
		if got, err := tx.Transfer(ctx, "p1", "t1"); err != nil || !sameTransfer(got, a) {
			t.Errorf("transfer = %+v, %v; want %+v", got, err, a)
		}
		if _, err := tx.Transfer(ctx, "p2", "t1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("transfer of another project: %v", err)
		}
		if got, err := tx.TransferByID(ctx, "t3"); err != nil || !sameTransfer(got, c) {
			t.Errorf("transfer by ID = %+v, %v; want %+v", got, err, c)
		}
		if _, err := tx.TransferByID(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown transfer by ID: %v", err)
		}
		if list, err := tx.HostTransfers(ctx, "h1"); err != nil || !slices.Equal(transferIDs(list), []string{"t1"}) {
			t.Errorf("host transfers = %v, %v", transferIDs(list), err)
		}
		if list, err := tx.PendingTransfers(ctx, 10); err != nil || !slices.Equal(transferIDs(list), []string{"t1", "t3"}) {
			t.Errorf("pending transfers = %v, %v", transferIDs(list), err)
		}
		if list, err := tx.PendingTransfers(ctx, 1); err != nil || !slices.Equal(transferIDs(list), []string{"t1"}) {
			t.Errorf("one pending transfer = %v, %v", transferIDs(list), err)
		}
		if list, err := tx.ExpiredTransfers(ctx, now, 10); err != nil || !slices.Equal(transferIDs(list), []string{"t3"}) {
			t.Errorf("expired transfers = %v, %v", transferIDs(list), err)
		}
		if list, err := tx.ExpiredTransfers(ctx, now.Add(2*time.Hour), 10); err != nil || !slices.Equal(transferIDs(list), []string{"t3", "t2"}) {
			t.Errorf("expired transfers later = %v, %v", transferIDs(list), err)
		}
		list, err := tx.Transfers(ctx, store.ObjectQuery{ProjectID: "p1", Limit: 1})
		if err != nil || !slices.Equal(transferIDs(list), []string{"t1"}) {
			t.Errorf("first page = %v, %v", transferIDs(list), err)
		}
		list, err = tx.Transfers(ctx, store.ObjectQuery{ProjectID: "p1", After: "t1", Limit: 10})
		if err != nil || !slices.Equal(transferIDs(list), []string{"t2"}) {
			t.Errorf("second page = %v, %v", transferIDs(list), err)
		}
		list, err = tx.Transfers(ctx, store.ObjectQuery{ProjectID: "p1", Selector: map[string]string{"env": "dev"}, Limit: 10})
		if err != nil || !slices.Equal(transferIDs(list), []string{"t2"}) {
			t.Errorf("selected = %v, %v", transferIDs(list), err)
		}
		return nil
	})

	// Every mutable field changes; CreatedAt stays.
	a.Body, a.Labels, a.HostID, a.Pending = []byte("v2"), map[string]string{"env": "dev"}, "", false
	a.ExpiresAt, a.UpdatedAt = now.Add(time.Minute), now.Add(time.Second)
	changed := a
	changed.CreatedAt = now.Add(time.Hour)
	update(t, s, func(tx store.Tx) error { return tx.UpdateTransfer(ctx, changed) })
	view(t, s, func(tx store.Tx) error {
		if got, err := tx.Transfer(ctx, "p1", "t1"); err != nil || !sameTransfer(got, a) {
			t.Errorf("updated transfer = %+v, %v; want %+v", got, err, a)
		}
		if list, err := tx.HostTransfers(ctx, "h1"); err != nil || len(list) != 0 {
			t.Errorf("host transfers after the export = %v, %v", transferIDs(list), err)
		}
		list, err := tx.Transfers(ctx, store.ObjectQuery{ProjectID: "p1", Selector: map[string]string{"env": "dev"}, Limit: 10})
		if err != nil || !slices.Equal(transferIDs(list), []string{"t1", "t2"}) {
			t.Errorf("selected after relabel = %v, %v", transferIDs(list), err)
		}
		return nil
	})
	other := a
	other.ProjectID = "p2"
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.UpdateTransfer(ctx, other) }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update of a transfer through another project: %v", err)
	}

	// A deleted transfer is still read, labels included, but never listed.
	a.DeletedAt, a.ExpiresAt = now.Add(time.Minute), time.Time{}
	c.DeletedAt = now
	update(t, s, func(tx store.Tx) error {
		if err := tx.UpdateTransfer(ctx, a); err != nil {
			return err
		}
		return tx.UpdateTransfer(ctx, c)
	})
	view(t, s, func(tx store.Tx) error {
		if got, err := tx.Transfer(ctx, "p1", "t1"); err != nil || !sameTransfer(got, a) || got.Labels["env"] != "dev" {
			t.Errorf("deleted transfer = %+v, %v; want %+v", got, err, a)
		}
		if list, err := tx.Transfers(ctx, store.ObjectQuery{ProjectID: "p1", Limit: 10}); err != nil || !slices.Equal(transferIDs(list), []string{"t2"}) {
			t.Errorf("transfers after delete = %v, %v", transferIDs(list), err)
		}
		if list, err := tx.PendingTransfers(ctx, 10); err != nil || len(list) != 0 {
			t.Errorf("pending after delete = %v, %v", transferIDs(list), err)
		}
		if list, err := tx.ExpiredTransfers(ctx, now.Add(2*time.Hour), 10); err != nil || !slices.Equal(transferIDs(list), []string{"t2"}) {
			t.Errorf("expired after delete = %v, %v", transferIDs(list), err)
		}
		return nil
	})
}
