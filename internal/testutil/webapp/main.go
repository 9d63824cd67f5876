// Command webapp is the guest-side web server of the exposure tests and
// benchmark: a static program copied into a workspace and started there.
// It serves a page whose JavaScript opens a WebSocket back to the server
// and shows the echo, the echo itself, the request it received as JSON,
// a stream of zero bytes, an upload sink, and a hostile page with its
// service worker; or, with -banner, a TCP
// server that is not HTTP. It records the method and
// URI of every request it receives, one line each, in -log.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

const page = `<!DOCTYPE html>
<html><head><title>webapp</title>
<style>body { background: #1e6bd6; color: #fff; font: 32px sans-serif; margin: 40px; }</style>
</head><body>
<h1>Hello from the guest</h1>
<p id="result">waiting</p>
<script>
const ws = new WebSocket(location.href.replace(/^http/, "ws").replace(/[?#].*$/, "").replace(/[^/]*$/, "") + "echo");
ws.onopen = () => ws.send("ping from the page");
ws.onmessage = (e) => { document.getElementById("result").textContent = "echo: " + e.data; };
ws.onerror = () => { document.getElementById("result").textContent = "websocket error"; };
</script>
</body></html>
`

// hostile is a page that tries what a guest page must not be able to do
// to the web console: read its token from session storage, and register
// a service worker over the whole origin. Its title reports both.
const hostile = `<!DOCTYPE html>
<html><head><title>trying</title></head><body><script>
const token = "token:" + sessionStorage.getItem("kibotos.token");
navigator.serviceWorker.register("sw.js", {scope: "/"}).then(
  () => { document.title = token + " sw:registered"; },
  (e) => { document.title = token + " sw:" + e.name; });
</script></body></html>
`

// takeover is a service worker that answers every page of its scope.
const takeover = `self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (e) => e.waitUntil(self.clients.claim()));
self.addEventListener("fetch", (e) => {
  if (e.request.mode === "navigate") {
    e.respondWith(new Response("<title>taken over</title>", {headers: {"Content-Type": "text/html"}}));
  }
});
`

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	logPath := flag.String("log", "/tmp/webapp-requests", "file that records every request")
	banner := flag.String("banner", "", "instead, on this address, greet each connection with a line that is not HTTP and close it")
	flag.Parse()
	if *banner != "" {
		log.Fatal(greet(*banner))
	}
	logFile, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	record := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			fmt.Fprintf(logFile, "%s %s\n", r.Method, r.RequestURI)
			mu.Unlock()
			h.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, page)
	})
	mux.HandleFunc("GET /hostile", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, hostile)
	})
	mux.HandleFunc("GET /sw.js", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		w.Header().Set("Service-Worker-Allowed", "/")
		io.WriteString(w, takeover)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/request", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"method": r.Method, "uri": r.RequestURI, "host": r.Host, "header": r.Header})
	})
	mux.HandleFunc("/zeros", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "want ?n=BYTES", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		buf := make([]byte, 256<<10)
		for n > 0 {
			m, err := w.Write(buf[:min(int64(len(buf)), n)])
			if err != nil {
				return
			}
			n -= int64(m)
		}
	})
	mux.HandleFunc("POST /upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d", n)
	})
	log.Fatal(http.ListenAndServe(*addr, record(mux)))
}

// greet answers every connection on addr with an SSH banner, as a server
// that is not HTTP does, and closes it.
func greet(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		io.WriteString(c, "SSH-2.0-webapp\r\n")
		c.Close()
	}
}
