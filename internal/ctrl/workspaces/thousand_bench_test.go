package workspaces

// Benchmarks of the control plane beside a thousand workspaces on one host.

import (
	"context"
	"testing"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
)

// thousandOnHost returns a service whose host h1, of room without end,
// holds a thousand workspaces, and the ID of the last one created.
func thousandOnHost(b *testing.B) (*Service, context.Context, string) {
	s, ctx := newService(b)
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 1 << 30, MemoryBytes: 1 << 50, LayerBytes: 1 << 50, DefaultLayerBytes: gib}}); err != nil {
		b.Fatal(err)
	}
	var last string
	for range 1000 {
		last = create(b, s, ctx, 128<<20).WorkspaceId
	}
	return s, ctx, last
}

// BenchmarkCreateBesidePlaced creates workspaces on a host that already
// holds a thousand: placement sums what they reserve.
func BenchmarkCreateBesidePlaced(b *testing.B) {
	s, ctx, _ := thousandOnHost(b)
	for b.Loop() {
		create(b, s, ctx, 128<<20)
	}
}

// BenchmarkAssignmentsOfThousand computes the desired set of a host that
// holds a thousand workspaces, as every change makes its watch do.
func BenchmarkAssignmentsOfThousand(b *testing.B) {
	s, ctx, _ := thousandOnHost(b)
	for b.Loop() {
		out, err := s.Assignments(ctx, "h1")
		if err != nil || len(out.Assignments) != 1000 {
			b.Fatalf("%d assignments, %v", len(out.GetAssignments()), err)
		}
	}
}

// BenchmarkReportBesideThousand folds one host report of a running
// workspace that changes nothing, on a host that holds a thousand.
func BenchmarkReportBesideThousand(b *testing.B) {
	s, ctx, last := thousandOnHost(b)
	as, err := s.Assignments(ctx, "h1")
	if err != nil {
		b.Fatal(err)
	}
	var rep *hostv1.ExecutionReport
	for _, a := range as.Assignments {
		if a.WorkspaceId == last {
			rep = &hostv1.ExecutionReport{ExecutionId: a.ExecutionId, WorkspaceId: last, Generation: a.Generation,
				State: hostv1.ObservedState_OBSERVED_STATE_RUNNING}
		}
	}
	for b.Loop() {
		if err := s.Report(ctx, "h1", []*hostv1.ExecutionReport{rep}, nil); err != nil {
			b.Fatal(err)
		}
	}
}
