package daemon_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/daemon"
)

// TestBadListenSetsUpNothing: an address that cannot be listened on is
// refused before anything of a new deployment is made (its home, store
// and admin token, shown once).
func TestBadListenSetsUpNothing(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1", "127.0.0.1:nosuchservice"} {
		home := t.TempDir()
		var out strings.Builder
		err := daemon.Run(t.Context(), daemon.Options{Home: home, Listen: addr, Out: &out})
		if err == nil || !strings.Contains(err.Error(), "--listen") {
			t.Errorf("--listen %s: %v", addr, err)
		}
		if entries, _ := os.ReadDir(home); len(entries) != 0 || out.Len() != 0 {
			t.Errorf("--listen %s left %d entries in the home and printed %q", addr, len(entries), out.String())
		}
	}
}

// TestBearerSchemeInAnyCase: the API takes the Bearer scheme in any case,
// as HTTP's authentication schemes are (RFC 9110), and nothing else.
func TestBearerSchemeInAnyCase(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	token, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	for scheme, want := range map[string]int{"Bearer": http.StatusOK, "bearer": http.StatusOK, "BEARER": http.StatusOK, "Basic": http.StatusUnauthorized} {
		req, err := http.NewRequest(http.MethodPost, d.url+"/kibotos.ctrl.v1.WorkspaceService/ListWorkspaces", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", scheme+" "+strings.TrimSpace(string(token)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %s, want %d", scheme, resp.Status, want)
		}
	}
}
