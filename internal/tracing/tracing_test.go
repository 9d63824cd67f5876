package tracing_test

import (
	"context"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/internal/testutil/otlptest"
	"github.com/kibotos/kibotos/internal/tracing"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// A control plane with tracing exports a span per call to the collector,
// linked to the trace the caller sent.
func TestTracesExported(t *testing.T) {
	col := otlptest.Start(t)
	tp, err := tracing.New(col.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Shutdown(context.Background())
	ic, err := tp.Interceptor()
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	ctl, token := ctrltest.New(t, testutil.SQLiteStore(t), server.Config{Checker: &netcheck.Checker{}, Tracing: ic})
	srv := httptest.NewServer(ctl.Handler)
	defer srv.Close()

	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	templates := ctrlv1connect.NewTemplateServiceClient(http.DefaultClient, srv.URL, connect.WithInterceptors(bearer.Token(token)))
	req := connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: "missing"})
	req.Header().Set("traceparent", "00-"+callerTrace+"-00f067aa0ba902b7-01")
	if _, err := templates.GetTemplate(ctx, req); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("GetTemplate: %v", err)
	}
	if err := tp.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	spans, services := col.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans exported, want 1: %v", len(spans), spans)
	}
	s := spans[0]
	if s.GetName() != "kibotos.ctrl.v1.TemplateService/GetTemplate" || s.GetKind() != tracepb.Span_SPAN_KIND_SERVER || services[0] != "kibotos" {
		t.Errorf("span %q kind %v of service %q", s.GetName(), s.GetKind(), services[0])
	}
	attrs := map[string]string{}
	for _, a := range s.GetAttributes() {
		attrs[a.GetKey()] = a.GetValue().GetStringValue()
	}
	if attrs["rpc.system"] != "connect_rpc" || attrs["rpc.connect_rpc.error_code"] != "not_found" {
		t.Errorf("span attributes %v", attrs)
	}
	// An untrusted caller's trace is linked, not continued.
	if len(s.GetLinks()) != 1 || hex.EncodeToString(s.GetLinks()[0].GetTraceId()) != callerTrace {
		t.Errorf("span links %v, want the caller's trace %s", s.GetLinks(), callerTrace)
	}
	if paths := col.Paths(); paths[0] != tracing.TracesPath {
		t.Errorf("exported to %s, want %s", paths[0], tracing.TracesPath)
	}
}

func TestEndpointRefused(t *testing.T) {
	for _, e := range []string{"127.0.0.1:4318", "ftp://x", "http://"} {
		if _, err := tracing.New(e); err == nil {
			t.Errorf("New(%q) took it", e)
		}
	}
}
