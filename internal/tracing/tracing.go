// Package tracing exports traces over OTLP/HTTP (protobuf) when an
// endpoint is configured (--otlp-endpoint): one span per API call of the
// control plane, made by connect's otelconnect interceptor, and one per
// data-plane call the host's gateway serves (Handler), batched and sent to
// a collector such as the OpenTelemetry Collector, Jaeger or Tempo.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kibotos/kibotos/internal/buildinfo"
)

// TracesPath is the OTLP/HTTP path of traces, added to an endpoint
// without a path.
const TracesPath = "/v1/traces"

// Provider is a tracer provider that exports to a collector.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// New returns a Provider exporting to endpoint, an http:// or https:// URL
// of an OTLP/HTTP collector (http://127.0.0.1:4318, or with a path, which
// is kept). Nothing is sent until a span ends.
func New(endpoint string) (*Provider, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("OTLP endpoint %q: want an http:// or https:// URL, such as http://127.0.0.1:4318", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = TracesPath
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return nil, fmt.Errorf("OTLP exporter: %w", err)
	}
	b := buildinfo.Get()
	res := resource.NewSchemaless(
		attribute.String("service.name", "kibotos"),
		attribute.String("service.version", b.Version),
	)
	return &Provider{tp: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))}, nil
}

// Interceptor returns the interceptor that makes a span of every call it
// serves, continuing a trace the caller propagates (W3C trace context).
func (p *Provider) Interceptor() (connect.Interceptor, error) {
	return otelconnect.NewInterceptor(otelconnect.WithTracerProvider(p.tp), otelconnect.WithoutMetrics(),
		otelconnect.WithPropagator(propagation.TraceContext{}))
}

// Handler returns next with a server span around each request, named
// after the Connect procedure its path names (as the interceptor's are),
// after its method and path when it is not a POST (the file bytes path's
// GET and PUT): the data-plane gateway's, which proxies calls rather than
// handling them, so that no Connect interceptor sees them. As with the interceptor, a
// trace the caller sends (W3C trace context) is linked, not continued.
// The span is in the request's context, from which the gateway passes it
// on to the guest agent.
func (p *Provider) Handler(next http.Handler) http.Handler {
	return otelhttp.NewHandler(next, "kibotos.data.v1",
		otelhttp.WithTracerProvider(p.tp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true }),
		otelhttp.WithMeterProvider(noop.NewMeterProvider()),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			name := strings.TrimPrefix(r.URL.Path, "/")
			if r.Method != http.MethodPost {
				name = r.Method + " " + name
			}
			return name
		}))
}

// Flush exports every span ended so far.
func (p *Provider) Flush(ctx context.Context) error { return p.tp.ForceFlush(ctx) }

// Shutdown exports what is left and stops exporting.
func (p *Provider) Shutdown(ctx context.Context) error { return p.tp.Shutdown(ctx) }
