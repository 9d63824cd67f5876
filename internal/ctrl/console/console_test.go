package console

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHandler checks what the handler serves: the page (built or the
// placeholder) with its headers, assets by name, nothing else.
func TestHandler(t *testing.T) {
	h := New()
	get := func(method, path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
		return w
	}
	page := get("GET", "/")
	if page.Code != 200 || page.Header().Get("Content-Type") != "text/html; charset=utf-8" ||
		page.Header().Get("Cache-Control") != "no-cache" || !strings.Contains(page.Header().Get("Content-Security-Policy"), "default-src 'self'") ||
		!strings.Contains(page.Body.String(), "Kibotos console") {
		t.Fatalf("GET /: %d %v %q", page.Code, page.Header(), page.Body.String())
	}
	etag := page.Header().Get("ETag")
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("If-None-Match", etag)
	h.ServeHTTP(w, r)
	if w.Code != http.StatusNotModified {
		t.Errorf("GET / with its ETag: %d", w.Code)
	}
	for name, f := range h.assets {
		a := get("GET", AssetsPrefix+name)
		if a.Code != 200 || a.Header().Get("Content-Type") != f.contentType || !strings.Contains(a.Header().Get("Cache-Control"), "immutable") {
			t.Errorf("GET %s: %d %v", name, a.Code, a.Header())
		}
		if !strings.Contains(page.Body.String(), AssetsPrefix+name) && !strings.HasSuffix(name, ".txt") {
			t.Errorf("the page does not load %s", name)
		}
	}
	for name, f := range h.assets {
		if f.gzipped == nil {
			continue
		}
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", AssetsPrefix+name, nil)
		r.Header.Set("Accept-Encoding", "br, gzip")
		h.ServeHTTP(w, r)
		if w.Header().Get("Content-Encoding") != "gzip" || !bytes.Equal(w.Body.Bytes(), f.gzipped) || w.Header().Get("ETag") == f.etag {
			t.Errorf("GET %s accepting gzip: %v", name, w.Header())
		}
		zr, err := gzip.NewReader(w.Body)
		if err != nil {
			t.Fatal(err)
		}
		if plain, err := io.ReadAll(zr); err != nil || !bytes.Equal(plain, f.body) {
			t.Errorf("%s gunzipped differs (%v)", name, err)
		}
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{{"GET", "/assets/missing.js", 404}, {"GET", "/other", 404}, {"POST", "/", 405}, {"HEAD", "/", 200}} {
		if got := get(c.method, c.path).Code; got != c.code {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got, c.code)
		}
	}
}

// TestConnectSources checks that the page may connect to the data-plane
// origins it is given, and to nothing a malformed one could smuggle in.
func TestConnectSources(t *testing.T) {
	h := New()
	h.DataPlaneOrigins = func(context.Context) []string {
		return []string{"https://host-1.example.com:8443/", "https://host-1.example.com:8443", "http://10.0.0.2:8870", "https://x; script-src *", "file:///etc"}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	got := w.Header().Get("Content-Security-Policy")
	if !strings.Contains(got, "connect-src 'self' https://host-1.example.com:8443 http://10.0.0.2:8870; ") || strings.Contains(got, "script-src") || strings.Contains(got, "file:") {
		t.Errorf("Content-Security-Policy: %s", got)
	}
}
