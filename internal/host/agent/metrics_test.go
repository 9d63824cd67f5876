package agent

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

func (e *gatewayEnv) readMetrics(tok string, opts ...connect.ClientOption) (*datav1.ReadMetricsResponse, error) {
	c := datav1connect.NewMetricsServiceClient(h2c(), e.url, append(opts, withSession(tok))...)
	resp, err := c.ReadMetrics(context.Background(), connect.NewRequest(&datav1.ReadMetricsRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// slotBytes returns what the guest's link in the slot namespace at path
// counts, after sending a datagram from there as a guest would when send
// is set.
func slotBytes(t *testing.T, path string, send bool) (received, sent uint64) {
	t.Helper()
	if send {
		if err := netnsfile.Do(path, func() error {
			c, err := net.Dial("udp4", "10.211.0.1:9")
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("kibotos"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	return nettest.LinkBytes(t, path)
}

// TestGatewayServesMetrics: the gateway answers ReadMetrics itself, after
// the same authorization as every call, with the driver's figures and the
// byte counters of the execution's network slot; an execution that ended
// is unavailable and a failed read is internal at READING_METRICS.
func TestGatewayServesMetrics(t *testing.T) {
	hosttest.RequireRoot(t) // a network slot is a network namespace
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	slot, err := netslot.Create(netslot.Config{Path: e.agent.netnsPath("ws_a-2")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := slot.Destroy(); err != nil {
			t.Error(err)
		}
	})
	figures := runtime.Metrics{CPU: 1500 * time.Millisecond, MemoryBytes: 40 << 20, MemoryLimitBytes: 256 << 20,
		MemorySomeAvg10: 1.5, MemoryFullAvg10: 0.25, LayerUsedBytes: 3 << 20, LayerCapacityBytes: 60 << 20,
		VolumeUsedBytes: 5 << 20, VolumeCapacityBytes: 120 << 20, Processes: 4}
	e.driver.SetMetrics("ws_a-2", figures, nil)
	tok := sign(k, "ses_1", "ws_a", 2, time.Hour)

	_, sentFirst := slotBytes(t, slot.Path(), false)
	slotBytes(t, slot.Path(), true)
	// The link counts the datagram once its queue hands it to the device,
	// which may be a moment after the send returned.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, sent := slotBytes(t, slot.Path(), false); sent >= sentFirst+uint64(len("kibotos")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest's link never counted the datagram sent")
		}
	}
	before := time.Now()
	for name, opts := range map[string][]connect.ClientOption{"connect": nil, "grpc": {connect.WithGRPC()}, "json": {connect.WithProtoJSON()}} {
		// The slot answers the datagram (port unreachable) when it will:
		// the figures lie between the guest's counts before and after.
		receivedBefore, sentBefore := slotBytes(t, slot.Path(), false)
		m, err := e.readMetrics(tok, opts...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		received, sent := slotBytes(t, slot.Path(), false)
		if m.NetworkRxBytes < receivedBefore || m.NetworkRxBytes > received || m.NetworkTxBytes < sentBefore || m.NetworkTxBytes > sent {
			t.Errorf("%s: network %d received, %d sent; the guest's link counted %d, %d before and %d, %d after",
				name, m.NetworkRxBytes, m.NetworkTxBytes, receivedBefore, sentBefore, received, sent)
		}
		if m.NetworkTxBytes < sentFirst+uint64(len("kibotos")) {
			t.Errorf("%s: %d bytes sent, not counting the datagram sent after %d", name, m.NetworkTxBytes, sentFirst)
		}
		if at := m.GetReadAt().AsTime(); at.Before(before.Add(-time.Second)) {
			t.Errorf("%s: read at %v, before the call", name, at)
		}
		want := &datav1.ReadMetricsResponse{CpuUsageSeconds: 1.5, MemoryBytes: 40 << 20, MemoryLimitBytes: 256 << 20,
			MemorySomeAvg10: 1.5, MemoryFullAvg10: 0.25, WritableLayerUsedBytes: 3 << 20, WritableLayerCapacityBytes: 60 << 20,
			VolumeUsedBytes: 5 << 20, VolumeCapacityBytes: 120 << 20, NetworkRxBytes: m.NetworkRxBytes, NetworkTxBytes: m.NetworkTxBytes,
			Processes: 4, ReadAt: m.ReadAt}
		if !proto.Equal(m, want) {
			t.Errorf("%s: %v, want %v", name, m, want)
		}
	}

	// Refused like any call, and never proxied: the guest saw nothing.
	_, err = e.readMetrics("")
	wantRefused(t, "no token", err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED)
	_, err = e.readMetrics(sign(k, "ses_1", "ws_a", 1, time.Hour))
	wantRefused(t, "old generation", err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED)
	e.guest.mu.Lock()
	if len(e.guest.auth) != 0 {
		t.Errorf("metrics calls reached the guest: %d", len(e.guest.auth))
	}
	e.guest.mu.Unlock()

	// A read that fails.
	e.driver.SetMetrics("ws_a-2", runtime.Metrics{}, errors.New("cpuacct.usage: input/output error"))
	_, err = e.readMetrics(tok)
	if connect.CodeOf(err) != connect.CodeInternal || testutil.ErrorDetail(err).GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_READING_METRICS {
		t.Errorf("failed read: %v (stage %v), want internal at READING_METRICS", err, testutil.ErrorDetail(err).GetStage())
	}

	// The execution ended before its report said so.
	if _, err := e.driver.Stop(context.Background(), "ws_a-2", runtime.StopForce, 0); err != nil {
		t.Fatal(err)
	}
	_, err = e.readMetrics(tok)
	wantRefused(t, "ended execution", err, connect.CodeUnavailable, ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE)
}
