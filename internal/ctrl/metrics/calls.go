package metrics

import (
	"context"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
)

// Calls counts and times the API calls that reach a method (a request
// connect-go itself refuses, such as one it cannot decode, reaches none).
// It is a connect.Interceptor for handlers; put it first, so that it sees
// what the interceptors after it refuse (unauthenticated calls).
type Calls struct {
	total    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// series keeps each procedure's and code's series once looked up: a
	// lookup by label values hashes them, a few µs per call.
	series sync.Map // callKey → callSeries
}

type callKey struct{ procedure, code string }

type callSeries struct {
	total    prometheus.Counter
	duration prometheus.Observer
}

// NewCalls returns Calls, registered on reg.
func NewCalls(reg prometheus.Registerer) (*Calls, error) {
	c := &Calls{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kibotos_api_calls_total",
			Help: "API calls that ended, by service, method and Connect code (ok for success).",
		}, []string{"service", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kibotos_api_call_duration_seconds",
			Help:    "Time from the start of an API call to its end (for a stream, its whole life), by service and method.",
			Buckets: prometheus.DefBuckets,
		}, []string{"service", "method"}),
	}
	for _, col := range []prometheus.Collector{c.total, c.duration} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// WrapUnary implements connect.Interceptor.
func (c *Calls) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		resp, err := next(ctx, req)
		c.observe(req.Spec().Procedure, start, err)
		return resp, err
	}
}

// WrapStreamingClient implements connect.Interceptor; client calls are
// not counted.
func (c *Calls) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor.
func (c *Calls) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		err := next(ctx, conn)
		c.observe(conn.Spec().Procedure, start, err)
		return err
	}
}

// observe records one call of procedure ("/package.Service/Method") that
// started at start and ended with err.
func (c *Calls) observe(procedure string, start time.Time, err error) {
	key := callKey{procedure, "ok"}
	if err != nil {
		key.code = connect.CodeOf(err).String()
	}
	series, ok := c.series.Load(key)
	if !ok {
		service, method, _ := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
		series, _ = c.series.LoadOrStore(key, callSeries{
			total:    c.total.WithLabelValues(service, method, key.code),
			duration: c.duration.WithLabelValues(service, method),
		})
	}
	s := series.(callSeries)
	s.total.Inc()
	s.duration.Observe(time.Since(start).Seconds())
}
