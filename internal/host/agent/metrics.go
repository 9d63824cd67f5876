package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// metricsService serves kibotos.data.v1.MetricsService in the gateway,
// behind its authorization: a workspace's figures are the host's (the
// driver's counters of the execution and the byte counters of its network
// slot), so no call reaches the guest.
type metricsService struct {
	datav1connect.UnimplementedMetricsServiceHandler
	agent *Agent
	now   func() time.Time
}

// ReadMetrics reads the figures of the execution the gateway authorized
// the call for. An execution that ended meanwhile is unavailable, as the
// gateway refuses one that does not run; a figure that cannot be read is
// internal with stage READING_METRICS.
func (s *metricsService) ReadMetrics(ctx context.Context, _ *connect.Request[datav1.ReadMetricsRequest]) (*connect.Response[datav1.ReadMetricsResponse], error) {
	id, _ := ctx.Value(executionKey{}).(string)
	m, err := s.agent.cfg.Driver.Metrics(ctx, id)
	var traffic netslot.Traffic
	if err == nil {
		traffic, err = netslot.ReadTraffic(s.agent.netnsPath(id))
	}
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, err
	case errors.Is(err, runtime.ErrNotFound):
		return nil, refuse(connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE,
			"the workspace's execution no longer runs on this host; retry shortly")
	default:
		slog.Warn("data plane: reading metrics", "execution", id, "err", err)
		return nil, metricsFailure(fmt.Errorf("reading the workspace's metrics: %w", err))
	}
	return connect.NewResponse(&datav1.ReadMetricsResponse{
		CpuUsageSeconds:            m.CPU.Seconds(),
		MemoryBytes:                m.MemoryBytes,
		MemoryLimitBytes:           m.MemoryLimitBytes,
		MemorySomeAvg10:            m.MemorySomeAvg10,
		MemoryFullAvg10:            m.MemoryFullAvg10,
		WritableLayerUsedBytes:     m.LayerUsedBytes,
		WritableLayerCapacityBytes: m.LayerCapacityBytes,
		VolumeUsedBytes:            m.VolumeUsedBytes,
		VolumeCapacityBytes:        m.VolumeCapacityBytes,
		NetworkRxBytes:             traffic.ReceivedBytes,
		NetworkTxBytes:             traffic.SentBytes,
		Processes:                  m.Processes,
		ReadAt:                     timestamppb.New(s.now()),
	}), nil
}

// metricsFailure is an internal error with the ErrorDetail of a failed
// read.
func metricsFailure(err error) error {
	ce := connect.NewError(connect.CodeInternal, err)
	if d, derr := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_INTERNAL,
		Stage: ctrlv1.FailureStage_FAILURE_STAGE_READING_METRICS}); derr == nil {
		ce.AddDetail(d)
	}
	return ce
}
