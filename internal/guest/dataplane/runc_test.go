package dataplane

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// guest is a guest agent running as PID 1 of a runc container, with
// clients of its data.sock.
type guest struct {
	d     *oci.Driver
	id    string
	state string // the driver's state directory
	ctx   context.Context
	pc    datav1connect.ProcessServiceClient
	fc    datav1connect.FileServiceClient
}

// startGuest starts the built guest agent in a busybox container of
// memory bytes, with extra files (name in the root: content) in its root,
// and waits until it answers probes.
func startGuest(t *testing.T, id string, memory uint64, extra map[string][]byte) *guest {
	t.Helper()
	hosttest.RequireContainers(t)
	tmp := t.TempDir()
	agent := filepath.Join(tmp, "kibotos-guest")
	if err := testutil.Build(agent, testutil.GuestAgentPackage); err != nil {
		t.Fatal(err)
	}
	g := &guest{id: id, state: filepath.Join(tmp, "runtime"), ctx: testCtx(t, 2*time.Minute)}
	var err error
	if g.d, err = oci.New(oci.Config{StateDir: g.state}); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(tmp, "layer.img")
	if err := g.d.CreateLayer(g.ctx, img, 64<<20); err != nil {
		t.Fatal(err)
	}
	root := hosttest.BusyboxRoot(t)
	for name, content := range extra {
		if err := os.WriteFile(filepath.Join(root, name), content, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := runtime.Spec{
		ID: id, Layers: []string{root}, LayerImage: img,
		CPUMillis: 1000, MemoryBytes: memory, PidsLimit: 256,
		GuestAgent: agent, Hostname: "guest",
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := g.d.Stop(ctx, id, runtime.StopForce, 0); err != nil {
			t.Errorf("cleanup stop: %v", err)
		}
	})
	if err := g.d.Start(g.ctx, spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; {
		pctx, cancel := context.WithTimeout(g.ctx, time.Second)
		err := g.d.Probe(pctx, id)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return g.d.DialGuest(ctx, id, guestabi.DataSocket)
		},
		Protocols: new(http.Protocols),
	}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	g.pc = datav1connect.NewProcessServiceClient(hc, "http://guest")
	g.fc = datav1connect.NewFileServiceClient(hc, "http://guest")
	return g
}

// run starts a process through the data plane and collects it to its end.
func (g *guest) run(t *testing.T, req *datav1.StartProcessRequest) *run {
	t.Helper()
	stream, err := g.pc.StartProcess(g.ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, stream)
}

// noHostPaths checks that err, from the guest, names no path of the host
// that runs it: the guest's files live in the test's temporary directory.
func (g *guest) noHostPaths(t *testing.T, err error) {
	t.Helper()
	if tmp := filepath.Dir(g.state); strings.Contains(err.Error(), tmp) {
		t.Errorf("the guest's error %q names the host path %s", err, tmp)
	}
}

// TestInGuest runs the built guest agent as PID 1 of a runc container and
// uses its data.sock: exits collected by the PID 1 reaper, a PTY, files
// as a user, and exits reported when a STOP ends the processes.
func TestInGuest(t *testing.T) {
	g := startGuest(t, "guest-data-test", 256<<20, nil)
	ctx, d, id, pc, fc := g.ctx, g.d, g.id, g.pc, g.fc

	// The exit status comes through the PID 1 reaper; the orphaned
	// background sleep is reaped too.
	if r := g.run(t, &datav1.StartProcessRequest{Args: []string{"sh", "-c", "sleep 0.2 & echo hi; exit 3"}}); r.stdout.String() != "hi\n" || r.exited.GetExitCode() != 3 {
		t.Fatalf("exit: stdout %q exited %v", r.stdout.String(), r.exited)
	}
	if r := g.run(t, &datav1.StartProcessRequest{Args: []string{"sh", "-c", "kill -9 $$"}}); r.exited.GetSignal() != "SIGKILL" {
		t.Fatalf("signal: %v", r.exited)
	}
	if r := g.run(t, &datav1.StartProcessRequest{Args: []string{"tty"}, Pty: &datav1.Pty{}}); !strings.HasPrefix(r.pty.String(), "/dev/pts/") {
		t.Fatalf("tty: %q (%v)", r.pty.String(), r.exited)
	}
	if r := g.run(t, &datav1.StartProcessRequest{Args: []string{"sh", "-c", "id -u; pwd"}, User: "app"}); r.stdout.String() != "1000\n/home/app\n" {
		t.Fatalf("as app: %q %q", r.stdout.String(), r.stderr.String())
	}
	// Files as a user: app may write its home, not /etc.
	ws := fc.WriteFile(ctx)
	ws.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: "notes", User: "app"}}})
	ws.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: []byte("hello guest")}})
	ws.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Commit{Commit: true}})
	resp, err := ws.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	if f := resp.Msg.GetFile(); f.GetPath() != "/home/app/notes" || f.GetOwner() != "app" || f.GetGroup() != "app" {
		t.Fatalf("written: %v", f)
	}
	ws = fc.WriteFile(ctx)
	ws.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: "/etc/motd", User: "app"}}})
	_, err = ws.CloseAndReceive()
	wantCode(t, err, connect.CodePermissionDenied, stageWritingFile)
	g.noHostPaths(t, err)
	rs, err := fc.ReadFile(ctx, connect.NewRequest(&datav1.ReadFileRequest{Path: "/no/such/file"}))
	if err == nil {
		rs.Receive()
		err = rs.Err()
	}
	wantCode(t, err, connect.CodeNotFound, stageReadingFile)
	g.noHostPaths(t, err)
	for _, req := range []*datav1.StartProcessRequest{
		{Args: []string{"/no/such/program"}},
		{Args: []string{"true"}, Cwd: "/no/such/dir", User: "app"},
	} {
		ps, err := pc.StartProcess(ctx, connect.NewRequest(req))
		if err == nil {
			ps.Receive()
			err = ps.Err()
		}
		if err == nil {
			t.Fatalf("%v started", req)
		}
		g.noHostPaths(t, err)
	}

	// A STOP ends a running process; its stream still gets the exit.
	stream, err := pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"sleep", "1000"}}))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{}
	r.waitFor(t, stream, "started", func() bool { return r.pid != 0 })
	stopped := make(chan error, 1)
	go func() {
		res, err := d.Stop(ctx, id, runtime.StopNormal, 2*time.Second)
		if err == nil && !res.Confirmed {
			err = context.DeadlineExceeded
		}
		stopped <- err
	}()
	r.waitFor(t, stream, "exit on stop", func() bool { return r.exited != nil })
	if r.exited.GetSignal() != "SIGTERM" {
		t.Fatalf("exit on stop: %v", r.exited)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
}
