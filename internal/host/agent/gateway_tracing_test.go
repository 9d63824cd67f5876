package agent

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/otlptest"
	"github.com/kibotos/kibotos/internal/tracing"
)

// TestGatewayTraced: a traced gateway exports a server span per
// data-plane call, refused or proxied, named after its procedure and
// linked to the trace the caller sent; the guest gets the span's trace
// context, not the caller's.
func TestGatewayTraced(t *testing.T) {
	e := newGatewayEnv(t)
	col := otlptest.Start(t)
	tp, err := tracing.New(col.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Shutdown(context.Background())
	e.url = testutil.H2CServer(t, tp.Handler(e.agent.Gateway())).URL

	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceparent := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("traceparent", "00-"+callerTrace+"-00f067aa0ba902b7-01")
			return next(ctx, req)
		}
	}))
	if _, err := e.inspect(h2c(), sign(k, "ses_1", "ws_a", 2, time.Hour), traceparent); err != nil {
		t.Fatal(err)
	}
	_, err = e.inspect(h2c(), "not-a-token", traceparent)
	wantRefused(t, "a bad token", err, connect.CodeUnauthenticated, ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED)
	if err := tp.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}

	spans, services := col.Spans()
	if len(spans) != 2 {
		t.Fatalf("%d spans exported, want 2: %v", len(spans), spans)
	}
	for i, s := range spans {
		if s.GetName() != "kibotos.data.v1.FileService/InspectFile" || s.GetKind() != tracepb.Span_SPAN_KIND_SERVER || services[i] != "kibotos" {
			t.Errorf("span %q kind %v of service %q", s.GetName(), s.GetKind(), services[i])
		}
		if hex.EncodeToString(s.GetTraceId()) == callerTrace || len(s.GetLinks()) != 1 || hex.EncodeToString(s.GetLinks()[0].GetTraceId()) != callerTrace {
			t.Errorf("span of trace %x, links %v: want a trace of its own linked to the caller's %s", s.GetTraceId(), s.GetLinks(), callerTrace)
		}
	}
	if status := spans[1].GetAttributes(); !hasInt(status, "http.response.status_code", 401) {
		t.Errorf("the refused call's span has attributes %v, want status 401", status)
	}

	e.guest.mu.Lock()
	defer e.guest.mu.Unlock()
	// Only the verified call reached the guest, with the gateway's span as
	// its parent.
	want := "00-" + hex.EncodeToString(spans[0].GetTraceId()) + "-" + hex.EncodeToString(spans[0].GetSpanId()) + "-01"
	if len(e.guest.trace) != 1 || e.guest.trace[0] != want {
		t.Errorf("the guest saw traceparent %q, want %q", e.guest.trace, want)
	}
	if strings.Contains(strings.Join(e.guest.trace, ""), callerTrace) {
		t.Error("the caller's trace reached the guest")
	}
}

// hasInt reports whether attrs hold key with the integer v.
func hasInt(attrs []*commonpb.KeyValue, key string, v int64) bool {
	for _, a := range attrs {
		if a.GetKey() == key {
			return a.GetValue().GetIntValue() == v
		}
	}
	return false
}
