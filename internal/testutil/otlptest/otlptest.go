// Package otlptest is an OTLP/HTTP trace collector for tests: it decodes
// what an exporter sends (protobuf, gzip or not) and keeps it.
package otlptest

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Collector is an OTLP/HTTP trace receiver that keeps what it decodes.
type Collector struct {
	// URL is where it listens, once started by Start.
	URL string

	mu       sync.Mutex
	requests []*coltracepb.ExportTraceServiceRequest
	paths    []string
}

// Start serves a Collector on loopback until the test ends.
func Start(t testing.TB) *Collector {
	c := &Collector{}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

func (c *Collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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

// Paths returns the URL path of every export received, in order.
func (c *Collector) Paths() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.paths...)
}

// Spans returns every span received with its resource's service name.
func (c *Collector) Spans() (spans []*tracepb.Span, services []string) {
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
