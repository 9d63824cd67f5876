package daemon_test

import (
	"context"
	"net"
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

// TestAdminTokenKeptBeforeCommit: a first start that cannot keep the
// admin token in its file commits no operator project, so the next start
// makes a token again and keeps it, and that token works.
func TestAdminTokenKeptBeforeCommit(t *testing.T) {
	home := t.TempDir()
	blocker := filepath.Join(home, daemon.AdminTokenFile, "x")
	if err := os.MkdirAll(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := daemon.Run(t.Context(), daemon.Options{Home: home, Listen: "127.0.0.1:0", Out: &out}); err == nil || !strings.Contains(err.Error(), "admin token") {
		t.Fatalf("a start that cannot write the token file: %v", err)
	}
	if out.Len() != 0 {
		t.Errorf("it printed %q", out.String())
	}
	if err := os.RemoveAll(filepath.Join(home, daemon.AdminTokenFile)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, daemon.Options{Home: home, Listen: "127.0.0.1:0", Out: &out, Ready: func(a net.Addr) { ready <- a }})
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("the next start: %v", err)
	}
	defer func() { cancel(); <-done }()
	token, err := os.ReadFile(filepath.Join(home, daemon.AdminTokenFile))
	if err != nil || !strings.Contains(out.String(), strings.TrimSpace(string(token))) {
		t.Fatalf("the next start printed %q and kept %q (%v)", out.String(), token, err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr.String()+"/kibotos.ctrl.v1.WorkspaceService/ListWorkspaces", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the kept token: %s", resp.Status)
	}
}

// TestBlobStoreOfOneDeployment: a second deployment refuses the blob
// store of another, whose transfer artifacts it would delete as its own
// garbage; the store's own deployment starts on it again.
func TestBlobStoreOfOneDeployment(t *testing.T) {
	blobs := "file://" + t.TempDir()
	first := t.TempDir()
	start := func(home string) error {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ready := make(chan net.Addr, 1)
		done := make(chan error, 1)
		go func() {
			done <- daemon.Run(ctx, daemon.Options{Home: home, Listen: "127.0.0.1:0", BlobsURL: blobs, Ready: func(a net.Addr) { ready <- a }})
		}()
		select {
		case <-ready:
			cancel()
			<-done
			return nil
		case err := <-done:
			return err
		}
	}
	if err := start(first); err != nil {
		t.Fatal(err)
	}
	if err := start(t.TempDir()); err == nil || !strings.Contains(err.Error(), "belongs to another deployment") {
		t.Errorf("a second deployment on the blob store: %v", err)
	}
	if err := start(first); err != nil {
		t.Errorf("the store's own deployment again: %v", err)
	}
}

// TestOneHostAgentAHome: a host agent (`kibotos host`) on the home of a
// running one, here that of `kibotos up`, is refused before it touches
// anything there (two would each end the other's executions as
// leftovers); once the first has stopped, its home serves again.
func TestOneHostAgentAHome(t *testing.T) {
	home := t.TempDir()
	d := up(t, home)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An address it cannot listen on: the one step after the lock it takes.
	host := daemon.Options{Home: home, CtrlURL: d.url, HostID: "second", TokenFile: token, Listen: "127.0.0.1:99999"}
	err := daemon.RunHost(t.Context(), host)
	d.stop()
	if err == nil || !strings.Contains(err.Error(), "another host agent serves the home") {
		t.Fatalf("kibotos host on the home of kibotos up: %v", err)
	}
	// The home is free: the agent goes on, to its listener.
	if err := daemon.RunHost(t.Context(), host); err == nil || !strings.Contains(err.Error(), "invalid port") {
		t.Fatalf("kibotos host on the home once kibotos up stopped: %v", err)
	}
}
