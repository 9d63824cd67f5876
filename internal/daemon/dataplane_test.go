package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// sdkClient returns an SDK client of the deployment with its admin token.
func (d *deployment) sdkClient() *sdk.Client {
	d.t.Helper()
	token, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		d.t.Fatal(err)
	}
	c := sdk.New(d.url, strings.TrimSpace(string(token)))
	d.t.Cleanup(c.Close)
	return c
}

// sdkWorkspace creates a workspace through the SDK and waits until it is
// AVAILABLE.
func (d *deployment) sdkWorkspace(memory, disk uint64) *sdk.Workspace {
	d.t.Helper()
	ws, err := d.sdkClient().CreateWorkspace(context.Background(), sdk.CreateOptions{MemoryBytes: memory, DiskBytes: disk})
	if err != nil {
		d.t.Fatal(err)
	}
	return ws
}

// TestDataPlaneProcesses runs processes through the gateway and the guest
// agent of a real workspace.
func TestDataPlaneProcesses(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	ws := d.sdkWorkspace(256<<20, 256<<20)

	var out, errOut bytes.Buffer
	st, err := ws.Exec(ctx, []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, sdk.ExecOptions{Stdout: &out, Stderr: &errOut})
	if err != nil || st.Code != 3 || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Errorf("exit code: %+v, %v, stdout %q, stderr %q", st, err, out.String(), errOut.String())
	}

	out.Reset()
	st, err = ws.Exec(ctx, []string{"cat"}, sdk.ExecOptions{Stdin: strings.NewReader("round trip\n"), Stdout: &out})
	if err != nil || !st.Success() || out.String() != "round trip\n" {
		t.Errorf("stdin round trip: %+v, %v, %q", st, err, out.String())
	}

	// Killing a command kills its children.
	p, err := ws.Start(ctx, []string{"sh", "-c", "sleep 1000 & sleep 1000"}, sdk.ExecOptions{Tag: "tree"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := p.Signal(ctx, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(); err != nil || st.Signal != "SIGKILL" {
		t.Errorf("killed process: %+v, %v", st, err)
	}
	// The signal reaches the whole group at once, but a member dies only
	// when next scheduled and is then reaped by PID 1: under load, a sleep
	// may outlive the leader's reported exit by a moment, never for good.
	eventually(t, 10*time.Second, "no sleep left after killing the tree", func() (string, error) {
		out.Reset()
		_, err := ws.Exec(ctx, []string{"sh", "-c", "ps -o stat,comm | grep sleep || true"}, sdk.ExecOptions{Stdout: &out})
		return out.String(), err
	}, func(left string) bool { return left == "" })

	// A PTY shell answers.
	var term testutil.SyncBuffer
	sh, err := ws.Start(ctx, []string{"sh", "-i"}, sdk.ExecOptions{PTY: &sdk.PTYSize{Cols: 80, Rows: 24}, Stdout: &term})
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.SendInput(ctx, []byte("echo $((6*7))\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(term.String(), "42") }, "the PTY shell to answer")
	sh.SendInput(ctx, []byte("exit\n"))
	sh.Wait()

	// A process keeps running when its caller drops, and its buffered
	// output is replayed on reconnect.
	dropCtx, drop := context.WithCancel(ctx)
	if _, err := ws.Start(dropCtx, []string{"sh", "-c", "echo before; sleep 1; echo after"}, sdk.ExecOptions{Tag: "survivor"}); err != nil {
		t.Fatal(err)
	}
	drop()
	time.Sleep(1500 * time.Millisecond)
	var replay bytes.Buffer
	again, err := ws.Connect(ctx, sdk.Tag("survivor"), &replay, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := again.Wait(); err != nil || !st.Success() || replay.String() != "before\nafter\n" {
		t.Errorf("reconnect: %+v, %v, %q", st, err, replay.String())
	}
}

// TestDataPlaneFiles moves files through the gateway.
func TestDataPlaneFiles(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	ws := d.sdkWorkspace(256<<20, 128<<20)
	data := make([]byte, 32<<20)
	rand.Read(data)
	if _, err := ws.Upload(ctx, bytes.NewReader(data), "/root/blob", 0o600); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if n, err := ws.Download(ctx, "/root/blob", h); err != nil || n != int64(len(data)) {
		t.Fatalf("download: %d, %v", n, err)
	}
	if want := sha256.Sum256(data); !bytes.Equal(h.Sum(nil), want[:]) {
		t.Error("downloaded bytes differ")
	}

	// Past the writable layer's capacity the write fails with no space and
	// the old file stays.
	if err := ws.WriteFile(ctx, "/root/keep", []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := io.LimitReader(zeroReader{}, 200<<20)
	_, err := ws.Upload(ctx, big, "/root/keep", 0o644)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("write past the layer: %v, want resource_exhausted", err)
	}
	if got, err := ws.ReadFile(ctx, "/root/keep"); err != nil || string(got) != "old" {
		t.Errorf("old file after the failed write: %q, %v", got, err)
	}
	_, err = ws.ReadFile(ctx, "/root/missing")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("missing file: %v", err)
	}
	if detail, ok := sdk.FailureOf(err); !ok || detail.Stage != ctrlv1.FailureStage_FAILURE_STAGE_READING_FILE ||
		detail.Reason != ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND {
		t.Errorf("failure detail of a missing file: %v", detail)
	}
}

// TestDataPlaneSessions checks the refusals of the gateway.
func TestDataPlaneSessions(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	client := d.sdkClient()
	a := d.sdkWorkspace(128<<20, 64<<20)
	b := d.sdkWorkspace(128<<20, 64<<20)
	token, _ := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	sessions := ctrlv1connectSessions(d, strings.TrimSpace(string(token)))
	issue := func(id string, ttl uint32) *ctrlv1.IssueSessionResponse {
		resp, err := sessions.IssueSession(ctx, connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: id, TtlSeconds: ttl}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}
	inspect := func(endpoint, token string) error {
		opts := []connect.ClientOption{}
		if token != "" {
			opts = append(opts, connect.WithInterceptors(bearer.Token(token)))
		}
		files := datav1connect.NewFileServiceClient(httpClient(), endpoint, opts...)
		_, err := files.InspectFile(ctx, connect.NewRequest(&datav1.InspectFileRequest{Path: "/"}))
		return err
	}
	reason := func(err error) ctrlv1.FailureReason {
		detail, _ := sdk.FailureOf(err)
		return detail.GetReason()
	}

	sa := issue(a.ID(), 0)
	if err := inspect(sa.Endpoint, sa.Token); err != nil {
		t.Fatalf("valid session: %v", err)
	}
	if err := inspect(sa.Endpoint, ""); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("no token: %v", err)
	}
	// A's token names A; rewritten to name B it fails like any forgery.
	forged := strings.Replace(sa.Token, a.ID(), b.ID(), 1)
	if err := inspect(sa.Endpoint, forged); connect.CodeOf(err) != connect.CodeUnauthenticated || reason(err) != ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED {
		t.Errorf("A's token aimed at B: %v", err)
	}

	short := issue(a.ID(), 1)
	time.Sleep(2100 * time.Millisecond)
	if err := inspect(short.Endpoint, short.Token); reason(err) != ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED {
		t.Errorf("expired token: %v", err)
	}

	revoked := issue(a.ID(), 0)
	if _, err := sessions.RevokeSession(ctx, connect.NewRequest(&ctrlv1.RevokeSessionRequest{Command: cmd(), SessionId: revoked.SessionId})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return reason(inspect(revoked.Endpoint, revoked.Token)) == ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED
	}, "revocation")

	// A revoked session's open stream is cut too.
	live := issue(a.ID(), 0)
	procs := datav1connect.NewProcessServiceClient(httpClient(), live.Endpoint, connect.WithInterceptors(bearer.Token(live.Token)))
	stream, err := procs.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"sleep", "30"}}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStarted() == nil {
		t.Fatalf("stream before revocation: %v", stream.Err())
	}
	if _, err := sessions.RevokeSession(ctx, connect.NewRequest(&ctrlv1.RevokeSessionRequest{Command: cmd(), SessionId: live.SessionId})); err != nil {
		t.Fatal(err)
	}
	cut := make(chan struct{})
	go func() {
		for stream.Receive() {
		}
		close(cut)
	}()
	select {
	case <-cut:
		if reason(stream.Err()) != ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED {
			t.Errorf("the stream of a revoked session ended %v, want SESSION_REVOKED", stream.Err())
		}
	case <-time.After(5 * time.Second):
		t.Error("the stream of a revoked session is still open")
	}
	stream.Close()

	// A session's expiry does not cut the calls it admitted: a command
	// may run longer than any session lives.
	brief := issue(a.ID(), 1)
	procs = datav1connect.NewProcessServiceClient(httpClient(), brief.Endpoint, connect.WithInterceptors(bearer.Token(brief.Token)))
	outlives, err := procs.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"sh", "-c", "sleep 3; echo done"}}))
	if err != nil {
		t.Fatal(err)
	}
	var out string
	var exited *datav1.ProcessEvent_Exited
	for outlives.Receive() {
		out += string(outlives.Msg().GetStdout())
		if e := outlives.Msg().GetExited(); e != nil {
			exited = e
		}
	}
	if exited == nil || exited.GetExitCode() != 0 || out != "done\n" {
		t.Errorf("a command outliving its session's 1 s: %q, exit %v, %v; want it to end on its own", out, exited, outlives.Err())
	}
	outlives.Close()

	// Revoking the API token that issued sessions revokes them too; the
	// sessions of other tokens go on.
	admin := adminv1connect.NewAdminServiceClient(httpClient(), d.url, connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token)))))
	leaky, err := admin.CreateToken(ctx, connect.NewRequest(&adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_EDITOR, Name: "leaky"}))
	if err != nil {
		t.Fatal(err)
	}
	fromLeaky, err := ctrlv1connectSessions(d, leaky.Msg.Secret).IssueSession(ctx, connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: b.ID()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := inspect(fromLeaky.Msg.Endpoint, fromLeaky.Msg.Token); err != nil {
		t.Fatalf("a session of the second token: %v", err)
	}
	if _, err := admin.RevokeToken(ctx, connect.NewRequest(&adminv1.RevokeTokenRequest{TokenId: leaky.Msg.Token.TokenId})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return reason(inspect(fromLeaky.Msg.Endpoint, fromLeaky.Msg.Token)) == ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED
	}, "the revoked token's session to be refused")
	if err := inspect(sa.Endpoint, sa.Token); err != nil {
		t.Errorf("a session of another token after the revocation: %v", err)
	}

	if _, err := sessions.RotateDataPlane(ctx, connect.NewRequest(&ctrlv1.RotateDataPlaneRequest{Command: cmd(), WorkspaceId: a.ID()})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return connect.CodeOf(inspect(sa.Endpoint, sa.Token)) == connect.CodeUnauthenticated }, "rotation")

	// A token issued before a stop does not work after the next start.
	sb := issue(b.ID(), 0)
	if _, err := client.StopWorkspace(ctx, b.ID(), sdk.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StartWorkspace(ctx, b.ID()); err != nil {
		t.Fatal(err)
	}
	if err := inspect(sb.Endpoint, sb.Token); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("token of the previous execution: %v", err)
	}
	if err := inspect(sb.Endpoint, issue(b.ID(), 0).Token); err != nil {
		t.Errorf("new session after the restart: %v", err)
	}
	ws, _ := client.Workspace(ctx, b.ID())
	if !slices.Contains(ws.Info().Reestablish, ctrlv1.ReestablishRequirement_REESTABLISH_REQUIREMENT_DATA_PLANE_SESSION) {
		t.Errorf("reestablish after a restart: %v", ws.Info().Reestablish)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	eventually(t, 10*time.Second, what, func() (bool, error) { return cond(), nil }, func(ok bool) bool { return ok })
}

// httpClient speaks cleartext HTTP/2, as streaming Connect calls need.
func httpClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

func ctrlv1connectSessions(d *deployment, token string) ctrlv1connect.SessionServiceClient {
	return ctrlv1connect.NewSessionServiceClient(httpClient(), d.url, connect.WithInterceptors(bearer.Token(token)))
}

// TestDataPlaneLargeFile writes and reads back 1 GiB while the memory of
// the host side (this process) and of the guest agent stays bounded.
func TestDataPlaneLargeFile(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	ws := d.sdkWorkspace(256<<20, 1280<<20)
	const size = 1 << 30
	peak := sampleHeap(t)
	sent := sha256.New()
	src := io.TeeReader(io.LimitReader(mathrand.NewChaCha8([32]byte{1}), size), sent)
	if _, err := ws.Upload(ctx, src, "/root/big", 0o644); err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	if n, err := ws.Download(ctx, "/root/big", got); err != nil || n != size {
		t.Fatalf("download: %d, %v", n, err)
	}
	if !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
		t.Error("SHA-256 of the 1 GiB file read back differs")
	}
	if heap := peak(); heap > 256<<20 {
		t.Errorf("host heap peaked at %d MiB moving 1 GiB; want it bounded", heap>>20)
	}
	if hwm := guestPeakRSS(t, d, ws.Info()); hwm > 128<<20 {
		t.Errorf("guest agent peak RSS %d MiB; want it bounded", hwm>>20)
	}
}

// sampleHeap samples this process's heap until the returned function is
// called, which returns the peak.
func sampleHeap(t *testing.T) func() uint64 {
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		var m goruntime.MemStats
		for {
			goruntime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(done); return peak.Load() }
}

// guestPeakRSS reads the peak resident set (VmHWM) of the guest agent.
func guestPeakRSS(t *testing.T, d *deployment, ws *ctrlv1.Workspace) uint64 {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(d.home, "runtime", "runc"), "state",
		fmt.Sprintf("%s-%d", ws.WorkspaceId, ws.Generation)).Output()
	if err != nil {
		t.Fatal(err)
	}
	var state struct{ Pid int }
	if err := json.Unmarshal(out, &state); err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", state.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestDataPlaneWatch checks that directory events arrive in order.
func TestDataPlaneWatch(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws := d.sdkWorkspace(128<<20, 64<<20)
	if err := ws.Mkdir(ctx, "/root/watched", 0o755); err != nil {
		t.Fatal(err)
	}
	events := make(chan *datav1.WatchDirectoryResponse, 64)
	go func() {
		for ev, err := range ws.Watch(ctx, "/root/watched", false) {
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	// The watch is in place once it reports a file made for the purpose,
	// whose events the check below leaves out.
	const ready = "/root/watched/ready"
	waitFor(t, func() bool {
		if _, err := ws.Exec(ctx, []string{"touch", ready}, sdk.ExecOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-events:
			return strings.HasSuffix(ev.Path, "ready")
		case <-time.After(200 * time.Millisecond):
			return false
		}
	}, "the watch to report a change")
	if _, err := ws.Exec(ctx, []string{"sh", "-c", "cd /root/watched && touch a && echo x >> a && mv a b && rm b"}, sdk.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []datav1.FileEventType{datav1.FileEventType_FILE_EVENT_TYPE_CREATE, datav1.FileEventType_FILE_EVENT_TYPE_WRITE,
		datav1.FileEventType_FILE_EVENT_TYPE_RENAME, datav1.FileEventType_FILE_EVENT_TYPE_REMOVE}
	var got []datav1.FileEventType
	deadline := time.After(10 * time.Second)
	for len(got) < len(want) {
		select {
		case ev := <-events:
			if strings.HasSuffix(ev.Path, "ready") {
				continue
			}
			// Collapse repeats (touch may report CHMOD, a write several WRITEs).
			if ev.Type == datav1.FileEventType_FILE_EVENT_TYPE_CHMOD || len(got) > 0 && got[len(got)-1] == ev.Type {
				continue
			}
			if ev.Type == datav1.FileEventType_FILE_EVENT_TYPE_CREATE && len(got) > 0 {
				continue // the rename's new name
			}
			got = append(got, ev.Type)
		case <-deadline:
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// TestExecAcrossTheWorkspacesStop stops a workspace under running execs:
// a normal stop ends the processes with SIGTERM and the execs report
// their exits, also of a process that takes seconds to exit on it (the
// call is not cut because the workspace stops); a forced stop, which
// takes the guest down with it, fails the exec as unavailable.
func TestExecAcrossTheWorkspacesStop(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	ws := d.sdkWorkspace(128<<20, 64<<20)

	p, err := ws.Start(ctx, []string{"sleep", "60"}, sdk.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	trapped, trappedOut := io.Pipe()
	slow, err := ws.Start(ctx, []string{"sh", "-c", "trap 'sleep 2; exit 5' TERM; echo trapped; while true; do sleep 0.1; done"},
		sdk.ExecOptions{Stdout: trappedOut})
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(trapped).ReadString('\n'); line != "trapped\n" {
		t.Fatalf("the trap's shell printed %q, %v", line, err)
	}
	d.stopWorkspace(ws.ID(), ctrlv1.StopMode_STOP_MODE_NORMAL)
	if st, err := p.Wait(); err != nil || st.Signal != "SIGTERM" {
		t.Errorf("exec across a normal stop: %v, %v; want its exit by SIGTERM", st, err)
	}
	if st, err := slow.Wait(); err != nil || st.Code != 5 {
		t.Errorf("exec of a process that exits 2 s after SIGTERM, across a normal stop: %v, %v; want exit status 5", st, err)
	}
	slow.Close()
	p.Close()
	d.await(ws.ID(), ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)

	if _, err := d.client.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.ID()})); err != nil {
		t.Fatal(err)
	}
	d.await(ws.ID(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	// The handle's session was of the first start: it takes a new one.
	first := p
	p, err = ws.Start(ctx, []string{"sleep", "60"}, sdk.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// A process handle of the first start names nothing in the second,
	// not even a process that has its pid.
	if err := first.Kill(ctx); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Kill through a handle of the first start: %v; want not_found", err)
	}
	if err := first.Signal(ctx, "SIGTERM"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Signal through a handle of the first start: %v; want not_found", err)
	}
	again, err := first.Connect(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Wait(); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Connect through a handle of the first start: %v; want not_found", err)
	}
	procs, err := ws.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(procs, func(i *datav1.ProcessInfo) bool { return int(i.GetPid()) == p.Pid() && i.GetExited() == nil }) {
		t.Errorf("the second start's process %d is not running: %v", p.Pid(), procs)
	}
	d.stopWorkspace(ws.ID(), ctrlv1.StopMode_STOP_MODE_FORCE)
	if st, err := p.Wait(); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("exec across a forced stop: %v, %v; want unavailable", st, err)
	} else if f, _ := sdk.FailureOf(err); f.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_UNAVAILABLE {
		t.Errorf("exec across a forced stop: %v, reason %v; want UNAVAILABLE", err, f.GetReason())
	}
}
