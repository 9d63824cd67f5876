// Package health serves the control plane's probes for supervisors and
// load balancers, without authentication: GET /healthz answers 200 while
// the process serves HTTP, GET /readyz answers 200 once every readiness
// check passes and 503 with the failing checks' reasons otherwise.
package health

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Paths of the probes.
const (
	LivePath  = "/healthz"
	ReadyPath = "/readyz"
)

// CheckTimeout bounds one readiness check.
const CheckTimeout = 2 * time.Second

// Check is one condition of readiness: Func returns nil when it holds, or
// why not.
type Check struct {
	Name string
	Func func(ctx context.Context) error
}

// Register adds GET /healthz and GET /readyz, which runs checks in order,
// to mux.
func Register(mux *http.ServeMux, checks []Check) {
	mux.HandleFunc("GET "+LivePath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET "+ReadyPath, func(w http.ResponseWriter, r *http.Request) {
		var failed []string
		for _, c := range checks {
			ctx, cancel := context.WithTimeout(r.Context(), CheckTimeout)
			err := c.Func(ctx)
			cancel()
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", c.Name, err))
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if len(failed) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %s\n", strings.Join(failed, "; "))
			return
		}
		fmt.Fprintln(w, "ready")
	})
}
