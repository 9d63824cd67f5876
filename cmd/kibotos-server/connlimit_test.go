package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
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

// TestOneProjectHoldsAQuarterOfTheConnections runs `kibotos up` with 512
// file descriptors, so that its listener holds 128 connections and one
// project's calls in flight at most 32. Calls of the admin's project
// whose requests never arrive whole take its 32 (each holds a connection
// over HTTP/1.1); the next call of that project is resource_exhausted at
// once, while another project's calls are served, and the project gets its
// calls back as the held ones end.
func TestOneProjectHoldsAQuarterOfTheConnections(t *testing.T) {
	hosttest.RequireRoot(t)
	bin := build(t)
	home := filepath.Join(t.TempDir(), "home")
	up := startProcess(t, "prlimit", "--nofile=512", bin,
		"up", "--home", home, "--listen", "127.0.0.1:0", "--desktop-cache=", "--warm-pool", "0")
	admin := adminToken(t, home)
	admins := adminv1connect.NewAdminServiceClient(http.DefaultClient, "http://"+up.addr, connect.WithInterceptors(bearer.Token(admin)))
	p, err := admins.CreateProject(t.Context(), connect.NewRequest(&adminv1.CreateProjectRequest{Name: "other"}))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := admins.CreateToken(t.Context(), connect.NewRequest(&adminv1.CreateTokenRequest{ProjectId: p.Msg.GetProject().GetProjectId(), Role: adminv1.Role_ROLE_VIEWER, Name: "other"}))
	if err != nil {
		t.Fatal(err)
	}
	list := func(token string) error {
		egresses := ctrlv1connect.NewEgressServiceClient(http.DefaultClient, "http://"+up.addr, connect.WithInterceptors(bearer.Token(token)))
		_, err := egresses.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
		return err
	}

	// share+extra calls whose bodies never arrive: share of them are
	// admitted and wait for their bodies, the extra ones are refused.
	const share, extra = 512 / 4 / 4, 8
	head := "POST " + ctrlv1connect.EgressServiceListEgressesProcedure + " HTTP/1.1\r\nHost: kibotos\r\nContent-Type: application/json\r\n" +
		"Authorization: Bearer " + admin + "\r\nContent-Length: 2\r\n\r\n"
	var held []net.Conn
	answers := make(chan string, share+extra)
	for range share + extra {
		conn := testutil.SendHead(t, up.addr, head)
		held = append(held, conn)
		go func() {
			status, _ := bufio.NewReader(conn).ReadString('\n')
			answers <- status
		}()
	}
	for range extra {
		select {
		case status := <-answers:
			if !strings.Contains(status, "429") {
				t.Fatalf("a call over the project's share: %q, want 429 (resource_exhausted)", status)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d calls of one project whose requests never arrive: fewer than %d refused", share+extra, extra)
		}
	}
	if err := list(admin); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a call of a project holding %d calls: %v, want resource_exhausted", share, err)
	}
	if err := list(tok.Msg.GetSecret()); err != nil {
		t.Errorf("another project's call meanwhile: %v", err)
	}
	for _, conn := range held {
		io.WriteString(conn, "{}") // the held calls end
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := list(admin)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the project's call once its held calls ended: %v", err)
		}
	}

	// A request no handler admits (here a path nothing serves) cannot hold
	// its connection by never sending its body.
	conn := testutil.SendHead(t, up.addr, "POST /nope HTTP/1.1\r\nHost: kibotos\r\nContent-Length: 1000\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if b, err := io.ReadAll(conn); err != nil {
		t.Errorf("a request to no service, whose body never comes, still holds its connection after 20 s (read %q): %v", b, err)
	}
}
