package workspaces

// This file is the census: how many workspaces are in each state, what
// their guests report, and what each host offers and has reserved, read
// from the store for the deployment's metrics.

import (
	"context"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/scheduler"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Census is the deployment's live workspaces (DELETED ones are not counted)
// and hosts at one moment.
type Census struct {
	// States counts the workspaces by state.
	States map[ctrlv1.WorkspaceState]int
	// GuestConditions counts the workspaces with a guest observation by
	// its condition; MemoryConditions those whose guest's memory condition
	// is known by it.
	GuestConditions  map[ctrlv1.GuestCondition]int
	MemoryConditions map[ctrlv1.GuestMemoryCondition]int
	// MemoryKills sums memory_kill_count over the guest observations, and
	// GuestRestarts restart_count: each counts within its execution, so the
	// sums fall when one ends.
	MemoryKills, GuestRestarts uint64
	// Hosts are the registered hosts with their capacity and what is
	// reserved on each, ordered by ID.
	Hosts []scheduler.Host
}

// censusPage is how many workspaces the census reads at a time.
const censusPage = 1000

// Census counts the deployment's workspaces and hosts in one read
// transaction.
func (s *Service) Census(ctx context.Context) (Census, error) {
	c := Census{States: map[ctrlv1.WorkspaceState]int{}, GuestConditions: map[ctrlv1.GuestCondition]int{},
		MemoryConditions: map[ctrlv1.GuestMemoryCondition]int{}}
	err := s.Store.View(ctx, func(tx store.Tx) error {
		projects, err := tx.Projects(ctx)
		if err != nil {
			return err
		}
		for _, p := range projects {
			for after := ""; ; {
				page, err := decodeAll(tx.Workspaces(ctx, store.ObjectQuery{ProjectID: p.ID, After: after, Limit: censusPage}))
				if err != nil {
					return err
				}
				for _, r := range page {
					c.count(r.ws)
				}
				if len(page) < censusPage {
					break
				}
				after = page[len(page)-1].row.ID
			}
		}
		hosts, err := s.hosts(ctx, tx, "")
		for _, h := range hosts {
			c.Hosts = append(c.Hosts, h.Host)
		}
		return err
	})
	return c, err
}

// count adds one workspace.
func (c *Census) count(ws *ctrlv1.Workspace) {
	c.States[ws.State]++
	g := ws.GuestObservation
	if g == nil {
		return
	}
	c.GuestConditions[g.Condition]++
	if g.MemoryCondition != ctrlv1.GuestMemoryCondition_GUEST_MEMORY_CONDITION_UNSPECIFIED {
		c.MemoryConditions[g.MemoryCondition]++
	}
	c.MemoryKills += uint64(g.MemoryKillCount)
	c.GuestRestarts += uint64(g.RestartCount)
}
