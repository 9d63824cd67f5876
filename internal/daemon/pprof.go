package daemon

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
)

// listenPprof listens on addr for the profiles, nil when addr is empty. A
// host that is not a loopback address (or localhost) is refused: the
// profiles show the process's memory and goroutines to whoever asks.
func listenPprof(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("pprof listen address %q: %w", addr, err)
	}
	if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("pprof listen address %q: serve the profiles on a loopback address, such as 127.0.0.1:6060", addr)
	}
	return net.Listen("tcp", addr)
}

// pprofHandler serves net/http/pprof under /debug/pprof/.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
