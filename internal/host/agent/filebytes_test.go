package agent

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
)

// serveFileBytes answers a GET of the file bytes path with as many MiB
// of zeros as its path names, with their length, as the guest agent does
// for a regular file.
func (g *guest) serveFileBytes(w http.ResponseWriter, r *http.Request) {
	g.saw(r.Header)
	mib, err := strconv.Atoi(r.URL.Query().Get("path"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(mib<<20))
	w.Header().Set(guestabi.FileInfoHeader, "info")
	chunk := make([]byte, 1<<20)
	for range mib {
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
}

// TestGatewayFileBytes checks a GET of the file bytes path through the
// gateway: the guest's bytes and headers, without the session token, and
// a download cut short once its session is revoked.
func TestGatewayFileBytes(t *testing.T) {
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	tok := sign(k, "ses_1", "ws_a", 2, time.Hour)
	get := func(token, mib string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, e.url+guestabi.FileBytesPath+"?path="+mib, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req) // HTTP/1.1: the bytes are spliced
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	resp := get(tok, "3")
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != 3<<20 || resp.Header.Get(guestabi.FileInfoHeader) != "info" {
		t.Errorf("GET of 3 MiB: %d bytes, %v, header %q", n, err, resp.Header.Get(guestabi.FileInfoHeader))
	}
	// The gateway's connection to the guest serves one GET and closes;
	// the caller's stays open for its next call.
	if resp.Close {
		t.Error("the gateway closed the caller's connection after a GET")
	}
	e.guest.mu.Lock()
	if len(e.guest.auth) != 1 || e.guest.auth[0] != "" {
		t.Errorf("the guest saw Authorization %q", e.guest.auth)
	}
	e.guest.mu.Unlock()

	if resp := get("bad", "1"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET with a bad token: %s", resp.Status)
	}

	// A revocation cuts a download in flight: what the sockets held
	// arrives, then the body ends short of its length.
	resp = get(tok, "1024")
	defer resp.Body.Close()
	if _, err := io.CopyN(io.Discard, resp.Body, 1<<20); err != nil {
		t.Fatal(err)
	}
	e.set(assignment("ws_a", 2, k, "ses_1"), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	time.Sleep(2 * reauthorizeEvery)
	n, err = io.Copy(io.Discard, resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) || n > 512<<20 {
		t.Errorf("after the revocation the download went on: %d more bytes, %v", n, err)
	}
	if !strings.Contains(resp.Header.Get("Content-Length"), strconv.Itoa(1024<<20)) {
		t.Errorf("Content-Length %q", resp.Header.Get("Content-Length"))
	}
}
