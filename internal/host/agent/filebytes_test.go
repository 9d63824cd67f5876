package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/testutil"
)

// serveFileBytes answers a GET of the file bytes path with as many MiB
// of zeros as its path names, with their length, as the guest agent does
// for a regular file. A PUT's answer tells how much of its body arrived
// and how it was sent; to the path "denied" it answers 403 at once,
// before the body, as the guest agent refuses a path it may not write.
func (g *guest) serveFileBytes(w http.ResponseWriter, r *http.Request) {
	g.saw(r.Header)
	if r.Method == http.MethodPut {
		if r.URL.Query().Get("path") == "denied" {
			http.Error(w, "permission denied", http.StatusForbidden)
			return
		}
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "received %d of length %d chunked %v", n, r.ContentLength, len(r.TransferEncoding) > 0)
		return
	}
	switch r.URL.Query().Get("path") {
	case "hostile":
		// A header without end, as far as the host would read it.
		w.Header().Set("X-Big", strings.Repeat("a", 4*maxGuestHeaderBytes))
		w.WriteHeader(http.StatusOK)
		return
	case "hostile-headers":
		for k, v := range hostileHeaders {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Length", "2")
		w.Write([]byte("ok"))
		return
	case "cut":
		// A file of no known length (a pipe's) whose reading fails
		// after a MiB: the guest agent aborts its answer, and the
		// chunked body never gets its last chunk.
		w.Write(make([]byte, 1<<20))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	case "switch":
		// A final 101 to a GET that asked for no upgrade.
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		buf.Flush()
		return
	}
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

// TestGatewayFileBytesPut checks a PUT of the file bytes path through the
// gateway: the body goes on whole and chunked (through the gateway's
// buffer of a MiB; rewriteFileBytes), whether the caller gave its length or
// not, without the session token; an answer the guest gives before it
// reads the body reaches the caller.
func TestGatewayFileBytesPut(t *testing.T) {
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	tok := sign(k, "ses_1", "ws_a", 2, time.Hour)
	put := func(path string, body io.Reader) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, e.url+guestabi.FileBytesPath+"?path="+path, body)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, b := testutil.Do(t, http.DefaultClient, req)
		return resp, string(b)
	}
	if resp, b := put("f", bytes.NewReader(make([]byte, 3<<20))); resp.StatusCode != http.StatusOK || b != "received 3145728 of length -1 chunked true" {
		t.Errorf("PUT of known length: %s %q", resp.Status, b)
	}
	if resp, b := put("f", io.LimitReader(zeros{}, 3<<20)); resp.StatusCode != http.StatusOK || b != "received 3145728 of length -1 chunked true" {
		t.Errorf("PUT of unknown length: %s %q", resp.Status, b)
	}
	if resp, b := put("denied", bytes.NewReader(make([]byte, 64<<20))); resp.StatusCode != http.StatusForbidden {
		t.Errorf("PUT the guest refuses before its body: %s %q", resp.Status, b)
	}
	// An upload whose session is revoked while its body comes ends with
	// the refusal, never with the 200 of an empty answer.
	body, more := io.Pipe()
	go func() {
		more.Write(make([]byte, 1<<20))
		time.Sleep(2 * reauthorizeEvery)
		e.set(assignment("ws_a", 2, k, "ses_1"), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
		time.Sleep(4 * reauthorizeEvery)
		more.Close()
	}()
	if resp, b := put("cut", body); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(b, "revoked") {
		t.Errorf("PUT cut by its session's revocation: %s %q", resp.Status, b)
	}
	e.guest.mu.Lock()
	defer e.guest.mu.Unlock()
	for _, a := range e.guest.auth {
		if a != "" {
			t.Errorf("the guest saw Authorization %q", a)
		}
	}
}

// zeros reads as endless zeros.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
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
	// A guest's header past the bound is refused, not read whole.
	if resp := get(tok, "hostile"); resp.StatusCode == http.StatusOK || resp.Header.Get("X-Big") != "" {
		t.Errorf("GET of a guest's endless header: %s, %d bytes of it passed on", resp.Status, len(resp.Header.Get("X-Big")))
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

// TestGatewayFileBytesCutShort: a file's bytes of no known length that the
// guest cuts short end the caller's answer as an error too, over HTTP/1.1
// and HTTP/2, never as a whole file. The gateway ended a chunked answer
// cleanly, and a download of a pipe whose writer was cut reported success.
func TestGatewayFileBytesCutShort(t *testing.T) {
	e := newGatewayEnv(t)
	k := key(1)
	e.set(assignment("ws_a", 2, k), hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	tok := sign(k, "ses_1", "ws_a", 2, time.Hour)
	for name, client := range map[string]*http.Client{"http1": http.DefaultClient, "h2c": h2c()} {
		req, _ := http.NewRequest(http.MethodGet, e.url+guestabi.FileBytesPath+"?path=cut", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Errorf("%s: a file's bytes cut after %d bytes read as a whole file", name, n)
		}
	}
}
