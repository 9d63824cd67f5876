package sdk

import (
	"context"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// Metrics reads what the Workspace's current execution uses now: CPU time,
// memory and its pressure, the writable layer's and the volume's
// filesystems, network bytes and processes, as the host that runs it
// counts them. Counters start from zero at each start of the Workspace;
// a rate (CPU use, say) is the difference of two reads over the
// difference of their ReadAt. A Workspace that does not run is
// CodeUnavailable.
func (w *Workspace) Metrics(ctx context.Context) (*datav1.ReadMetricsResponse, error) {
	return unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.ReadMetricsRequest]) (*connect.Response[datav1.ReadMetricsResponse], error) {
		return d.metrics.ReadMetrics
	}, &datav1.ReadMetricsRequest{})
}
