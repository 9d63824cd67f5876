package tracing_test

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"connectrpc.com/connect"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/bearer"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/internal/tracing"
)

// collector is an OTLP/HTTP trace receiver that keeps what it decodes.
type collector struct {
	mu       sync.Mutex
	requests []*coltracepb.ExportTraceServiceRequest
	paths    []string
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	req := new(coltracepb.ExportTraceServiceRequest)
	if err == nil {
		err = proto.Unmarshal(b, req)
	}
	if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "not an OTLP protobuf export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.requests = append(c.requests, req)
	c.paths = append(c.paths, r.URL.Path)
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// spans returns every span received with its resource's service name.
func (c *collector) spans() (spans []*tracepb.Span, services []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, req := range c.requests {
		for _, rs := range req.GetResourceSpans() {
			var service string
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					spans = append(spans, s)
					services = append(services, service)
				}
			}
		}
	}
	return spans, services
}

// A control plane with tracing exports a span per call to the collector,
// linked to the trace the caller sent.
func TestTracesExported(t *testing.T) {
	col := &collector{}
	cs := httptest.NewServer(col)
	defer cs.Close()
	tp, err := tracing.New(cs.URL)
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

	spans, services := col.spans()
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
	if col.paths[0] != tracing.TracesPath {
		t.Errorf("exported to %s, want %s", col.paths[0], tracing.TracesPath)
	}
}

func TestEndpointRefused(t *testing.T) {
	for _, e := range []string{"127.0.0.1:4318", "ftp://x", "http://"} {
		if _, err := tracing.New(e); err == nil {
			t.Errorf("New(%q) took it", e)
		}
	}
}
