package sdktest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk"
)

// TestFileBytesOverHTTP calls the file bytes path as curl would, with a
// session's token: its reads and writes, its Connect errors, the
// gateway's refusals, and a body cut short, which writes nothing.
func TestFileBytesOverHTTP(t *testing.T) {
	if sdk.FileBytesPath != guestabi.FileBytesPath || sdk.FileInfoHeader != guestabi.FileInfoHeader {
		t.Fatalf("the SDK's %s, %s differ from the guest's %s, %s", sdk.FileBytesPath, sdk.FileInfoHeader, guestabi.FileBytesPath, guestabi.FileInfoHeader)
	}
	ws := newWorkspace(t)
	s, err := ws.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, token string, query url.Values, body io.Reader) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, s.Endpoint+sdk.FileBytesPath+"?"+query.Encode(), body)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		return testutil.Do(t, http.DefaultClient, req)
	}
	codeOf := func(b []byte) string {
		var e struct{ Code string }
		json.Unmarshal(b, &e)
		return e.Code
	}

	data := bytes.Repeat([]byte("0123456789abcdef"), 200_000) // 3.2 MB
	resp, b := call(http.MethodPut, s.Token, url.Values{"path": {"/tmp/f"}, "mode": {"640"}}, bytes.NewReader(data))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"size":"3200000"`) {
		t.Fatalf("PUT: %s %s", resp.Status, b)
	}
	if got := sh(t, ws, "stat -c '%a %s' /tmp/f"); got != "640 3200000\n" {
		t.Errorf("after PUT: stat = %q", got)
	}
	resp, b = call(http.MethodGet, s.Token, url.Values{"path": {"/tmp/f"}}, nil)
	if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(data)) || !bytes.Equal(b, data) {
		t.Errorf("GET: %s, length %d, %d bytes, same: %v", resp.Status, resp.ContentLength, len(b), bytes.Equal(b, data))
	}
	info := new(datav1.FileInfo)
	if raw, err := base64.StdEncoding.DecodeString(resp.Header.Get(sdk.FileInfoHeader)); err != nil || proto.Unmarshal(raw, info) != nil || info.GetSize() != uint64(len(data)) || info.GetMode() != 0o640 {
		t.Errorf("%s: %q (%v)", sdk.FileInfoHeader, resp.Header.Get(sdk.FileInfoHeader), info)
	}

	// Connect errors, as JSON with their HTTP status.
	for _, c := range []struct {
		method string
		query  url.Values
		status int
		code   string
	}{
		{http.MethodGet, url.Values{"path": {"/nope"}}, http.StatusNotFound, "not_found"},
		{http.MethodGet, url.Values{"path": {"/tmp/f"}, "user": {"nobody"}}, http.StatusForbidden, "permission_denied"},
		{http.MethodGet, url.Values{"path": {"/tmp"}}, http.StatusBadRequest, "failed_precondition"},
		{http.MethodGet, url.Values{}, http.StatusBadRequest, "invalid_argument"},
		{http.MethodPut, url.Values{"path": {"/root/x"}, "user": {"nobody"}}, http.StatusForbidden, "permission_denied"},
		{http.MethodPut, url.Values{"path": {"/tmp/g"}, "mode": {"99"}}, http.StatusBadRequest, "invalid_argument"},
		{http.MethodPut, url.Values{"path": {"/tmp/g"}, "user": {"no-such-user"}}, http.StatusBadRequest, "invalid_argument"},
	} {
		resp, b := call(c.method, s.Token, c.query, strings.NewReader("x"))
		if resp.StatusCode != c.status || codeOf(b) != c.code {
			t.Errorf("%s %v: %s %s, want %d %s", c.method, c.query, resp.Status, b, c.status, c.code)
		}
	}
	if resp, _ := call(http.MethodPost, s.Token, url.Values{"path": {"/tmp/f"}}, nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s", resp.Status)
	}

	// The gateway refuses a call without a valid token before the guest.
	other := s.Token[:len(s.Token)-2] + map[bool]string{true: "AA", false: "BB"}[strings.HasSuffix(s.Token, "BB")]
	for _, token := range []string{"", "tok_nothing", other} {
		resp, b := call(http.MethodGet, token, url.Values{"path": {"/tmp/f"}}, nil)
		if resp.StatusCode != http.StatusUnauthorized || codeOf(b) != "unauthenticated" {
			t.Errorf("GET with token %q: %s %s", token, resp.Status, b)
		}
	}
	if resp, _ := call(http.MethodPut, other, url.Values{"path": {"/tmp/f"}}, strings.NewReader("y")); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("PUT with a forged token: %s", resp.Status)
	}

	// A body that ends before its length writes nothing.
	u, err := url.Parse(s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT %s?path=/tmp/f HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s",
		sdk.FileBytesPath, u.Host, s.Token, 10<<20, bytes.Repeat([]byte("z"), 1<<20))
	time.Sleep(200 * time.Millisecond)
	conn.Close()
	want := "3200000 0\n"
	got := ""
	for deadline := time.Now().Add(10 * time.Second); got != want && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got = sh(t, ws, "echo $(stat -c %s /tmp/f) $(ls -a /tmp | grep -c kibotos)")
	}
	if got != want {
		t.Errorf("after a cut PUT: size and temporary files %q, want %q", got, want)
	}
}

// TestFileBytesCallerEnds: an upload or download whose context ends is
// canceled or deadline_exceeded, not unavailable (which says "retry
// it"), and the context's error is in its chain.
func TestFileBytesCallerEnds(t *testing.T) {
	ws := newWorkspace(t)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	stalled, _ := io.Pipe() // a source that never gives a byte
	_, err := ws.Upload(ctx, stalled, "/tmp/never", 0o644)
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Upload past its deadline: %v (%v); want deadline_exceeded", err, connect.CodeOf(err))
	}

	sh(t, ws, "head -c 8388608 /dev/zero > /tmp/big")
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	_, err = ws.Download(ctx, "/tmp/big", writerFunc(func(p []byte) (int, error) {
		cancel() // the caller gives up after the first bytes
		return len(p), nil
	}))
	if connect.CodeOf(err) != connect.CodeCanceled || !errors.Is(err, context.Canceled) {
		t.Errorf("Download canceled midway: %v (%v); want canceled", err, connect.CodeOf(err))
	}
}

// writerFunc is an io.Writer of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
