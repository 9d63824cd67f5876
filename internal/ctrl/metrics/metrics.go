// Package metrics is ctrl's side of the deployment's Prometheus metrics:
// an interceptor that counts and times every API call by service, method
// and Connect code, a collector that reads the workspaces and hosts from
// the store at every scrape, and the handler of GET /metrics. Each
// deployment has a registry of its own, so several run in one process.
package metrics

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kibotos/kibotos/sdk/bearer"
)

// Path is where the control-plane listener serves the metrics.
const Path = "/metrics"

// Handler serves what g gathers in the Prometheus exposition formats (the
// text format unless the scraper asks for another). With a token, only a
// request that sends it as "Authorization: Bearer <token>" gets them; any
// other is unauthenticated (401). A collector that fails leaves out its
// metrics, logs why, and serves the rest.
func Handler(g prometheus.Gatherer, token string) http.Handler {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: errorLog{}, ErrorHandling: promhttp.ContinueOnError})
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearer.Parse(r.Header.Get("Authorization"))
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kibotos metrics"`)
			http.Error(w, "the metrics token is required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// errorLog logs the handler's errors.
type errorLog struct{}

// Println implements promhttp.Logger.
func (errorLog) Println(v ...any) { slog.Error("serving metrics", "err", fmt.Sprint(v...)) }
