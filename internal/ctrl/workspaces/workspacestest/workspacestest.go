// Package workspacestest plays a host for tests of the control-plane
// services built on workspaces (sessions, exposures): it registers the
// host and reports what its executions do, as the host agent would.
package workspacestest

import (
	"context"
	"testing"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

// HostID is the ID of the host Register registers.
const HostID = "h1"

// Host is host HostID of a workspaces.Service.
type Host struct {
	t   testing.TB
	ctx context.Context
	s   *workspaces.Service
}

// Register registers host HostID with s, with room for a few workspaces,
// its data plane at endpoint and, unless it is empty, its exposure domain.
func Register(t testing.TB, ctx context.Context, s *workspaces.Service, endpoint, domain string) *Host {
	t.Helper()
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: HostID, DataPlaneEndpoint: endpoint, ExposureDomain: domain,
		Capacity: &hostv1.HostCapacity{CpuMillis: 8000, MemoryBytes: 8 << 30, LayerBytes: 100 << 30, DefaultLayerBytes: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	return &Host{t: t, ctx: ctx, s: s}
}

// Assignment returns what ctrl wants of the workspace's execution on the
// host; the test fails without one.
func (h *Host) Assignment(id string) *hostv1.Assignment {
	h.t.Helper()
	list, err := h.s.Assignments(h.ctx, HostID)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, a := range list.Assignments {
		if a.WorkspaceId == id {
			return a
		}
	}
	h.t.Fatalf("no assignment of %s", id)
	return nil
}

// Report reports the workspace's current execution in state.
func (h *Host) Report(id string, state hostv1.ObservedState) {
	h.t.Helper()
	a := h.Assignment(id)
	if err := h.s.Report(h.ctx, HostID, []*hostv1.ExecutionReport{{ExecutionId: a.ExecutionId, WorkspaceId: id,
		Generation: a.Generation, State: state}}, nil); err != nil {
		h.t.Fatal(err)
	}
}
