// Package console serves the web console: a single-page application built
// from console/ (TypeScript, bundled with esbuild by `make build` into
// dist/) and embedded in the binary. It serves the page at / and the
// bundle's files under /assets/; everything else on the listener is the
// API's. When the bundle was not built (a plain `go build` of a clean
// checkout), / serves dist/unbuilt.html, which says so.
//
// The console adds no server-side logic: the page calls the same Connect
// API any client does, with the token the user signs in with, and the
// data-plane gateways at the endpoints of the sessions it issues, which
// may be other origins (a host's public URL): the page's
// Content-Security-Policy lets it connect to its own origin and to those
// the handler's DataPlaneOrigins names.
package console

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"
)

//go:embed dist
var dist embed.FS

// AssetsPrefix is the path under which the bundle's files are served.
const AssetsPrefix = "/assets/"

// contentTypes are the types of the files a bundle holds, by extension;
// any other file is application/octet-stream. They do not depend on the
// machine's MIME tables.
var contentTypes = map[string]string{
	".html":  "text/html; charset=utf-8",
	".js":    "text/javascript; charset=utf-8",
	".css":   "text/css; charset=utf-8",
	".map":   "application/json",
	".svg":   "image/svg+xml",
	".png":   "image/png",
	".woff2": "font/woff2",
	".txt":   "text/plain; charset=utf-8",
}

// csp is the Content-Security-Policy of every response, %s the origins
// the page may connect to beyond its own: the page loads nothing but its
// own origin's files and is never framed.
const csp = "default-src 'self'; connect-src 'self'%s; img-src 'self' data: blob:; " +
	"style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// securityHeaders go on every response with the Content-Security-Policy.
var securityHeaders = map[string]string{
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
	"X-Frame-Options":        "DENY",
}

type file struct {
	body        []byte
	gzipped     []byte // body gzip-compressed, when that is smaller
	contentType string
	etag        string
}

// Handler serves the console. Mount it at "/{$}" and AssetsPrefix.
type Handler struct {
	*bundle
	// DataPlaneOrigins, when set, returns the origins (scheme://host[:port])
	// of the deployment's data-plane gateways, which the page may connect
	// to; the page's own origin it may always.
	DataPlaneOrigins func(context.Context) []string
}

// bundle is the embedded page and assets, read (and compressed) once per
// process however many handlers serve them.
type bundle struct {
	index  file
	assets map[string]file // by name under dist/assets
}

var read = sync.OnceValue(func() *bundle {
	b := &bundle{assets: map[string]file{}}
	index, err := dist.ReadFile("dist/index.html")
	if err != nil {
		index, _ = dist.ReadFile("dist/unbuilt.html")
	}
	b.index = newFile("index.html", index)
	sub, err := fs.Sub(dist, "dist/assets")
	if err == nil {
		fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			content, err := fs.ReadFile(sub, p)
			if err == nil {
				b.assets[p] = newFile(p, content)
			}
			return err
		})
	}
	return b
})

// New returns a handler of the embedded bundle.
func New() *Handler { return &Handler{bundle: read()} }

func newFile(name string, body []byte) file {
	sum := sha256.Sum256(body)
	ct, ok := contentTypes[path.Ext(name)]
	if !ok {
		ct = "application/octet-stream"
	}
	f := file{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
	var gz bytes.Buffer
	w, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	w.Write(body)
	w.Close()
	if gz.Len() < len(body) {
		f.gzipped = gz.Bytes()
	}
	return f
}

// acceptsGzip reports whether a request's Accept-Encoding lists gzip
// (without q=0).
func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.TrimSpace(coding) == "gzip" && strings.ReplaceAll(params, " ", "") != "q=0" {
				return true
			}
		}
	}
	return false
}

// connectSources returns the data-plane origins as CSP sources, each
// with a leading space; an origin that is not a plain http(s) origin (a
// CSP source must not carry ';' or ',') is left out.
func (h *Handler) connectSources(ctx context.Context) string {
	if h.DataPlaneOrigins == nil {
		return ""
	}
	var b strings.Builder
	seen := map[string]bool{}
	for _, o := range h.DataPlaneOrigins(ctx) {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(u.Host, " ;,'") {
			continue
		}
		origin := u.Scheme + "://" + u.Host
		if !seen[origin] {
			seen[origin] = true
			b.WriteString(" " + origin)
		}
	}
	return b.String()
}

// Built reports whether the bundle was built into the binary.
func (h *Handler) Built() bool { return len(h.assets) > 0 }

// ServeHTTP serves / (the page, revalidated on every load) and the files
// under AssetsPrefix (named by their content's hash, so cached for a
// year), gzip-compressed (once, when the bundle is read) for a client that
// accepts it. Other methods than GET and HEAD are 405; other paths 404.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var f file
	var cache string
	switch {
	case r.URL.Path == "/":
		f, cache = h.index, "no-cache"
	case strings.HasPrefix(r.URL.Path, AssetsPrefix):
		var ok bool
		if f, ok = h.assets[strings.TrimPrefix(r.URL.Path, AssetsPrefix)]; !ok {
			http.NotFound(w, r)
			return
		}
		cache = "public, max-age=31536000, immutable"
	default:
		http.NotFound(w, r)
		return
	}
	for k, v := range securityHeaders {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Security-Policy", fmt.Sprintf(csp, h.connectSources(r.Context())))
	w.Header().Set("Content-Type", f.contentType)
	w.Header().Set("Cache-Control", cache)
	body, etag := f.body, f.etag
	if f.gzipped != nil {
		w.Header().Set("Vary", "Accept-Encoding")
		if acceptsGzip(r) {
			// A representation of its own: its own ETag.
			body, etag = f.gzipped, strings.TrimSuffix(f.etag, `"`)+`-gzip"`
			w.Header().Set("Content-Encoding", "gzip")
		}
	}
	w.Header().Set("ETag", etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}
