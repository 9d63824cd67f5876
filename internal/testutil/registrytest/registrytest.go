// Package registrytest serves go-containerregistry's in-memory registry on
// loopback for tests: over plain HTTP, behind basic auth, or over TLS with
// a certificate a private authority signed.
package registrytest

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	gcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

// User and Password are the credentials a registry with auth requires.
const User, Password = "alice", "s3cret"

// Handler is the registry, quiet; with auth it requires User and Password
// by basic auth and answers others as a registry does.
func Handler(auth bool) http.Handler {
	h := gcrregistry.New(gcrregistry.Logger(log.New(io.Discard, "", 0)))
	if !auth {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != User || p != Password {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Start serves Handler(auth) over plain HTTP until the test ends and
// returns its host:port.
func Start(t testing.TB, auth bool) string {
	t.Helper()
	srv := httptest.NewServer(Handler(auth))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// StartTLS serves Handler(false) over TLS until the test ends; it returns
// the registry's host:port, the authority that signed its certificate
// (PEM) and a client that trusts it.
func StartTLS(t testing.TB) (host, caPEM string, client *http.Client) {
	t.Helper()
	serverTLS, caPEM := testtls.New(t, "127.0.0.1")
	srv := httptest.NewUnstartedServer(Handler(false))
	srv.TLS = serverTLS
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "https://"), caPEM, srv.Client()
}

// PutManifest stores m in the registry at host under repo:tag as it is,
// whether or not the registry holds the blobs it names: the registry
// then serves a manifest it cannot back.
func PutManifest(t testing.TB, host, repo, tag string, m *v1.Manifest) {
	t.Helper()
	body, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	call(t, http.MethodPut, "http://"+host+"/v2/"+repo+"/manifests/"+tag, body, string(m.MediaType))
}

// DeleteBlob removes a blob of repo from the registry at host.
func DeleteBlob(t testing.TB, host, repo string, digest v1.Hash) {
	t.Helper()
	call(t, http.MethodDelete, "http://"+host+"/v2/"+repo+"/blobs/"+digest.String(), nil, "")
}

// call makes one request of the registry with User and Password, which a
// registry without auth ignores, and fails the test unless it succeeds.
func call(t testing.TB, method, url string, body []byte, contentType string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.SetBasicAuth(User, Password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s", method, url, resp.Status)
	}
}
