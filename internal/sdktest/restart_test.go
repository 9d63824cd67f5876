package sdktest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk"
)

// restartable is a `kibotos up` of one test's own, in this process, that
// the test stops and starts again on the same home and address, as an
// operator restarts the server: sessions name its address, and its
// workspaces run on across the restart. The package's shared deployment
// cannot be restarted under the other tests.
type restartable struct {
	t     *testing.T
	home  string
	guest string
	addr  string // where it listens: 127.0.0.1:0 until the first start, that address after
	url   string
	token string

	cancel context.CancelFunc
	done   chan error
}

// upRestartable starts a restartable deployment; it is stopped, and
// everything it ran deleted, when the test ends.
func upRestartable(t *testing.T) *restartable {
	t.Helper()
	hosttest.RequireContainers(t)
	dir := t.TempDir()
	d := &restartable{t: t, home: filepath.Join(dir, "home"), guest: filepath.Join(dir, "kibotos-guest"), addr: "127.0.0.1:0"}
	if err := testutil.Build(d.guest, testutil.GuestAgentPackage); err != nil {
		t.Fatal(err)
	}
	d.start()
	token, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	d.token = strings.TrimSpace(string(token))
	t.Cleanup(func() {
		if d.done == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := sdk.New(d.url+"/", d.token)
		defer c.Close()
		if all, err := c.ListWorkspaces(ctx, nil); err == nil {
			for _, ws := range all {
				if err := c.DeleteWorkspace(ctx, ws.GetWorkspaceId()); err != nil {
					t.Errorf("deleting %s: %v", ws.GetWorkspaceId(), err)
				}
			}
		} else {
			t.Errorf("listing the workspaces to delete: %v", err)
		}
		d.stop()
	})
	return d
}

// start runs `kibotos up` on the deployment's home and address and waits
// until it serves.
func (d *restartable) start() {
	d.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel, d.done = cancel, make(chan error, 1)
	ready := make(chan net.Addr, 1)
	go func() {
		d.done <- daemon.Run(ctx, daemon.Options{Home: d.home, Listen: d.addr, Host: true, GuestAgent: d.guest,
			ExposureListen: "127.0.0.1:0", Ready: func(a net.Addr) { ready <- a }})
	}()
	select {
	case a := <-ready:
		// A restart listens where the first start did: its sessions'
		// endpoint must stay the same.
		d.addr, d.url = a.String(), "http://"+a.String()
	case err := <-d.done:
		cancel()
		d.done = nil
		d.t.Fatalf("kibotos up: %v", err)
	case <-time.After(60 * time.Second):
		d.t.Fatal("kibotos up did not start in 60s")
	}
}

// stop stops `kibotos up` (its context's end, as SIGTERM) and waits until
// it has exited.
func (d *restartable) stop() {
	d.t.Helper()
	d.cancel()
	if err := <-d.done; err != nil {
		d.t.Errorf("kibotos up: %v", err)
	}
	d.done = nil
}

// TestExecAcrossARestartKillsItsProcess: an Exec whose stream a restart
// of the deployment broke kills its process once the data plane serves
// again, though the host agent, just started, refuses calls "out of
// service" for a while (unavailable, as for a workspace that stopped);
// or, when it cannot within killTimeout, says the process may still run.
// It never returns saying nothing while the process runs on.
func TestExecAcrossARestartKillsItsProcess(t *testing.T) {
	d := upRestartable(t)
	c := sdk.New(d.url+"/", d.token)
	defer c.Close()
	ws, err := c.CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	execErr := make(chan error, 1)
	go func() {
		_, err := ws.Exec(t.Context(), []string{"sh", "-c", "sleep 120"}, sdk.ExecOptions{Tag: "across"})
		execErr <- err
	}()
	running := func() (bool, error) {
		procs, err := ws.Processes(t.Context())
		for _, p := range procs {
			if p.GetTag() == "across" {
				return p.GetExited() == nil, err
			}
		}
		return false, err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if ok, _ := running(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process did not start")
		}
	}

	d.stop()
	d.start()

	var err2 error
	select {
	case err2 = <-execErr:
	case <-time.After(time.Minute):
		t.Fatal("Exec did not return after the restart")
	}
	if connect.CodeOf(err2) != connect.CodeUnavailable {
		t.Fatalf("Exec across a restart: %v, want unavailable", err2)
	}
	if strings.Contains(err2.Error(), "may still run") {
		t.Logf("the process could not be killed in time, and Exec says so: %v", err2)
		return
	}
	t.Logf("Exec across a restart: %v", err2)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ok, err := running()
		if err == nil && !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process of the Exec still runs, and Exec did not say it may (%v); last listing: %v", err2, err)
		}
	}
}

// TestExecOfAForcedStopSaysNothingRuns: an Exec whose workspace is
// stopped with force, its kill refused unavailable as the workspace no
// longer runs, returns without saying its process may still run: it ended
// with its execution.
func TestExecOfAForcedStopSaysNothingRuns(t *testing.T) {
	c := newClient(t)
	ws, err := c.CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	execErr := make(chan error, 1)
	go func() {
		_, err := ws.Exec(t.Context(), []string{"sh", "-c", "sleep 120"}, sdk.ExecOptions{Tag: "stopped"})
		execErr <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		procs, _ := ws.Processes(t.Context())
		if len(procs) == 1 && procs[0].GetTag() == "stopped" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process did not start")
		}
	}
	if _, err := c.StopWorkspace(t.Context(), ws.ID(), sdk.StopOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-execErr; err != nil && strings.Contains(err.Error(), "may still run") {
		t.Fatalf("Exec of a workspace stopped with force: %v, want no process that may still run", err)
	} else {
		t.Logf("Exec of a workspace stopped with force: %v", err)
	}
}
