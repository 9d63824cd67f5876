package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk"
)

// TestAFloodOfConnectionsLeavesTheHostItsDescriptors runs `kibotos up`
// with 512 file descriptors and opens more idle connections to its
// listener than that: they take at most a quarter of the descriptors, the
// rest waiting in the kernel's backlog, so a caller whose connection was
// open before still creates a workspace and runs a process in it, which
// takes descriptors of the host agent in the same process. Without the
// bound the process accepted until it had no descriptor left.
func TestAFloodOfConnectionsLeavesTheHostItsDescriptors(t *testing.T) {
	hosttest.RequireRoot(t)
	bin := build(t)
	home := filepath.Join(t.TempDir(), "home")
	const nofile = 512
	up := startProcess(t, "prlimit", fmt.Sprintf("--nofile=%d", nofile), bin,
		"up", "--home", home, "--listen", "127.0.0.1:0", "--desktop-cache=", "--warm-pool", "0")
	c := sdk.New("http://"+up.addr+"/", adminToken(t, home))
	defer c.Close()
	if _, err := c.ListWorkspaces(t.Context(), nil); err != nil { // opens the caller's connection
		t.Fatal(err)
	}
	before := descriptors(t, up.cmd.Process.Pid)

	var flood []net.Conn
	defer func() {
		for _, conn := range flood {
			conn.Close()
		}
	}()
	for range nofile {
		conn, err := net.DialTimeout("tcp", up.addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d of the flood: %v", len(flood)+1, err)
		}
		flood = append(flood, conn)
	}
	// Until the process has accepted what it will: no change for a second.
	held := descriptors(t, up.cmd.Process.Pid)
	for stable := time.Now(); time.Since(stable) < time.Second; time.Sleep(100 * time.Millisecond) {
		if n := descriptors(t, up.cmd.Process.Pid); n != held {
			held, stable = n, time.Now()
		}
	}
	if limit := before + nofile/4 + 16; held > limit { // 16: what the process opens meanwhile
		t.Fatalf("the flood holds %d descriptors of the process (%d before it), more than a quarter of its %d", held-before, before, nofile)
	}

	ws, err := c.CreateWorkspace(t.Context(), sdk.CreateOptions{MemoryBytes: 128 << 20, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatalf("create during the flood: %v", err)
	}
	if st, err := ws.Exec(t.Context(), []string{"true"}, sdk.ExecOptions{}); err != nil || !st.Success() {
		t.Fatalf("exec during the flood: %v, %v", st, err)
	}
	if err := c.DeleteWorkspace(t.Context(), ws.ID()); err != nil {
		t.Fatal(err)
	}
}

// descriptors counts the open file descriptors of process pid.
func descriptors(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}
