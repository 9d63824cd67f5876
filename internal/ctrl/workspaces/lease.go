package workspaces

// This file is host leases: a host that stops reporting for a lease
// period is LOST, and what it runs is UNKNOWN until it reports again.

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// DefaultHostLease is how long a host may stay silent before it is LOST.
const DefaultHostLease = 30 * time.Second

// ReportInterval is how often a host reports when nothing changes, for a
// lease: a third of it, so that two missed reports do not lose a host.
func ReportInterval(lease time.Duration) time.Duration { return lease / 3 }

// ExpireLeases makes every host that has not reported since lease ago
// LOST: its workspaces that hold or await an execution (CREATING,
// STARTING, AVAILABLE, STOPPING) become UNKNOWN, keeping the state they
// had, and so do its Volumes. Nothing on a LOST host expires, is placed
// or completes as if it ran. It runs in one transaction and changes only
// what is not LOST yet, so every ctrl replica may run it at once.
//
// A host's silence counts at the earliest from this process's first
// ExpireLeases, and from its first after one that failed: while no ctrl
// ran, or ctrl could not reach its store, hosts could not report (they
// retry with back-off), and a ctrl that comes back after longer than a
// lease must not find every host LOST before it had a chance to report.
func (s *Service) ExpireLeases(ctx context.Context) (err error) {
	lease := s.Lease()
	now := s.Now.UTC()
	s.leasesSince.CompareAndSwap(nil, &now)
	since := *s.leasesSince.Load()
	defer func() {
		if err != nil {
			s.leasesSince.Store(nil)
		}
	}()
	return s.updateAnnouncing(ctx, func(tx store.Tx) ([]string, error) {
		var changed []string
		hosts, err := tx.Hosts(ctx)
		if err != nil {
			return changed, err
		}
		for _, h := range hosts {
			if !h.LostAt.IsZero() || now.Sub(later(h.SeenAt, since)) < lease {
				continue
			}
			h.LostAt = now
			if err := tx.UpdateHost(ctx, h); err != nil {
				return changed, err
			}
			vols, err := s.Volumes.HostLost(ctx, tx, h.ID)
			if err != nil {
				return changed, err
			}
			changed = append(changed, vols...)
			records, err := decodeAll(tx.HostWorkspaces(ctx, h.ID))
			if err != nil {
				return changed, err
			}
			for _, r := range records {
				switch r.ws.State {
				case ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING,
					ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING:
				default:
					continue
				}
				r.book.Unknown, r.ws.State = r.ws.State, ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
				r.ws.GuestObservation = nil
				deliveryStale(r)
				if err := s.save(ctx, tx, r); err != nil {
					return changed, err
				}
				changed = append(changed, r.row.ID)
			}
		}
		return changed, nil
	})
}

// hostSeen records, inside a host's registration or report, that the host
// is alive. A host that was LOST is back: its UNKNOWN workspaces and
// Volumes take the states they had again (what the host reports next
// moves them on), except those released meanwhile, which stay released.
// It returns the workspaces that changed.
func (s *Service) hostSeen(ctx context.Context, tx store.Tx, hostID string) ([]string, error) {
	h, found, err := hostByID(ctx, tx, hostID)
	if err != nil || !found {
		return nil, err
	}
	wasLost := !h.LostAt.IsZero()
	h.SeenAt, h.LostAt = s.Now.UTC(), time.Time{}
	if err := tx.UpdateHost(ctx, h); err != nil || !wasLost {
		return nil, err
	}
	changed, err := s.Volumes.HostBack(ctx, tx, hostID)
	if err != nil {
		return nil, err
	}
	records, err := decodeAll(tx.HostWorkspaces(ctx, hostID))
	if err != nil {
		return nil, err
	}
	for _, r := range records {
		if r.ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN || r.book.Unknown == 0 {
			continue
		}
		r.ws.State, r.book.Unknown = r.book.Unknown, 0
		if err := s.save(ctx, tx, r); err != nil {
			return nil, err
		}
		changed = append(changed, r.row.ID)
	}
	return changed, nil
}

// hostLost reports whether the host a workspace is placed on is LOST (or
// no longer registered).
func hostLost(ctx context.Context, tx store.Tx, hostID string) (bool, error) {
	h, found, err := hostByID(ctx, tx, hostID)
	return !found || !h.LostAt.IsZero(), err
}

// releaseUnknown completes the stop of a workspace whose host is LOST: it
// is STOPPED at once, its stop UNCONFIRMED (nothing synced the layer), and
// its execution is no longer wanted. Should the host come back, its
// assignment says to stop that execution, and reports of it move nothing.
func (s *Service) releaseUnknown(r *record) {
	r.book.Unknown = 0
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
	if r.ws.LastStop != nil {
		r.ws.LastStop.Durability = ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED
		r.ws.LastStop.CompletedAt = timestamppb.New(s.Now.UTC())
	}
	clearNetwork(r.ws)
	r.ws.GuestObservation = nil
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
