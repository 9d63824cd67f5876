package workspaces

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// TestRevokedHostsNameMovesOnlyByRegistration: once the token a host
// registered with is revoked, another token neither watches nor reports
// for the host, nor reads the artifacts its workspaces restore from
// (permission_denied), which would keep the host READY and hand that
// token its assignments' data-plane keys; it takes the name by
// registering the host, and is then its owner.
func TestRevokedHostsNameMovesOnlyByRegistration(t *testing.T) {
	s, ctx := newService(t)
	if err := s.Store.Update(ctx, func(tx store.Tx) error {
		for _, id := range []string{"htk_a", "htk_b"} {
			if err := tx.CreateHostToken(ctx, store.HostToken{ID: id, Name: id, SecretHash: []byte(id), CreatedAt: time.Now(), HostIDs: []string{"h2"}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	asA, asB := auth.WithHostToken(ctx, "htk_a"), auth.WithHostToken(ctx, "htk_b")
	register := func(ctx context.Context) error {
		return s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h2", Capacity: &hostv1.HostCapacity{
			CpuMillis: 4000, MemoryBytes: 4 * gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib}})
	}
	if err := register(asA); err != nil {
		t.Fatal(err)
	}
	createRestored(t, s, ctx, "tr_x") // placed on h2, the most memory free
	if err := s.CheckRestoring(asA, "h2", "tr_x"); err != nil {
		t.Fatalf("h2's own token reading the artifact of its restore: %v", err)
	}
	if err := s.Store.Update(ctx, func(tx store.Tx) error { return tx.RevokeHostToken(ctx, "htk_a", time.Now()) }); err != nil {
		t.Fatal(err)
	}

	refused := func(when string) {
		t.Helper()
		if err := s.CheckRegistered(asB, "h2"); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s: another token watching or reporting for h2: %v, want permission_denied", when, err)
		}
		if err := s.CheckRestoring(asB, "h2", "tr_x"); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s: another token reading h2's artifact: %v, want permission_denied", when, err)
		}
		if _, err := s.CollectableLayers(asB, "h2", nil); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s: another token asking for h2's layers: %v, want permission_denied", when, err)
		}
	}
	refused("h2's token revoked")
	if err := register(asB); err != nil {
		t.Fatalf("registering the host of a revoked token: %v", err)
	}
	if err := s.CheckRegistered(asB, "h2"); err != nil {
		t.Errorf("the token that registered h2 last: %v", err)
	}
	if err := s.CheckRestoring(asB, "h2", "tr_x"); err != nil {
		t.Errorf("the token that registered h2 last, reading the artifact of its restore: %v", err)
	}
}

// TestBoundTokenActsOnlyAsItsHosts: a host token issued for h2 neither
// watches nor reports for h1, which registered with no token (as hosts
// registered before hosts kept theirs), nor for a host no one registered.
func TestBoundTokenActsOnlyAsItsHosts(t *testing.T) {
	s, ctx := newService(t) // h1 registered without a host token
	if err := s.Store.Update(ctx, func(tx store.Tx) error {
		return tx.CreateHostToken(ctx, store.HostToken{ID: "htk_b", SecretHash: []byte("b"), CreatedAt: time.Now(), HostIDs: []string{"h2"}})
	}); err != nil {
		t.Fatal(err)
	}
	asB := auth.WithHostToken(ctx, "htk_b")
	for _, host := range []string{"h1", "h9"} {
		if err := s.CheckRegistered(asB, host); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("a token issued for h2 acting as %s: %v, want permission_denied", host, err)
		}
	}
	if _, err := s.CollectableLayers(asB, "h1", nil); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("a token issued for h2 asking for h1's layers: %v, want permission_denied", err)
	}
}
