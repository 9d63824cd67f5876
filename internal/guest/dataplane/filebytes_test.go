package dataplane

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestGetFileBytesSendsFile: a GET of a regular file over HTTP/1.1, as the
// gateway makes it, is answered by sendfile on a connection taken over
// (closed after the body); over HTTP/2, which cannot be taken over, by
// the copy. Both give the file's bytes, its length and its FileInfo.
func TestGetFileBytesSendsFile(t *testing.T) {
	e := newTestEnv(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 300_000) // 4.8 MB
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	h1 := &http.Transport{DialContext: e.dial}
	defer h1.CloseIdleConnections()
	for _, c := range []struct {
		name      string
		transport *http.Transport
		sendfile  bool
	}{
		{"HTTP/1.1", h1, true},
		{"HTTP/2", e.h2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, "http://guest"+guestabi.FileBytesPath+"?path="+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, body := testutil.Do(t, &http.Client{Transport: c.transport}, req)
			if resp.StatusCode != http.StatusOK || !bytes.Equal(body, data) {
				t.Fatalf("%s, %d bytes; want 200 and the file's %d", resp.Status, len(body), len(data))
			}
			if got := resp.Header.Get("Content-Length"); got != strconv.Itoa(len(data)) {
				t.Errorf("Content-Length %q", got)
			}
			if resp.Header.Get(guestabi.FileInfoHeader) == "" {
				t.Error("no FileInfo header")
			}
			if resp.Close != c.sendfile {
				t.Errorf("connection closed after the body: %v, want %v (sent by sendfile on a connection taken over)", resp.Close, c.sendfile)
			}
		})
	}
}

// TestGetFileBytesOfKernelFiles: files a kernel filesystem makes up as
// they are read (proc's report 0 bytes, sysfs's 4096) and an empty file
// are read to their end, not cut at the size stat gives.
func TestGetFileBytesOfKernelFiles(t *testing.T) {
	e := newTestEnv(t)
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h1 := &http.Transport{DialContext: e.dial}
	defer h1.CloseIdleConnections()
	for _, path := range []string{"/proc/version", "/sys/devices/system/cpu/online", empty} {
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for name, transport := range map[string]*http.Transport{"HTTP/1.1": h1, "HTTP/2": e.h2} {
			req, err := http.NewRequest(http.MethodGet, "http://guest"+guestabi.FileBytesPath+"?path="+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, body := testutil.Do(t, &http.Client{Transport: transport}, req)
			if resp.StatusCode != http.StatusOK || !bytes.Equal(body, want) {
				t.Errorf("%s over %s: %s, %q; want %q", path, name, resp.Status, body, want)
			}
		}
	}
}
