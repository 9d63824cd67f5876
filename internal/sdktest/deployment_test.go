package sdktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk"
)

func TestMain(m *testing.M) { os.Exit(uptest.Main(m)) }

// newClient returns a client of the package's deployment, which runs
// workspaces on runc, in a project of the test's own.
func newClient(t *testing.T) *sdk.Client {
	t.Helper()
	d := uptest.Shared(t)
	c := sdk.New(d.URL+"/", d.Project(t))
	t.Cleanup(c.Close)
	return c
}

// small are the resources of a workspace the deployment starts quickly.
var small = sdk.CreateOptions{CPUMillis: 500, MemoryBytes: 128 << 20, DiskBytes: 64 << 20}

// newWorkspace returns an AVAILABLE workspace of the test's own.
func newWorkspace(t *testing.T) *sdk.Workspace {
	t.Helper()
	ws, err := newClient(t).CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// sh runs a shell command in the workspace and returns its stdout.
func sh(t *testing.T, ws *sdk.Workspace, script string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	st, err := ws.Exec(t.Context(), []string{"sh", "-c", script}, sdk.ExecOptions{Stdout: &out, Stderr: &errOut})
	if err != nil || !st.Success() {
		t.Fatalf("sh -c %q: %v, %v\nstderr: %s", script, st, err, errOut.String())
	}
	return out.String()
}

func TestCreateWorkspaceWaitsUntilAvailable(t *testing.T) {
	opts := small
	opts.Template = "base"
	opts.Labels = map[string]string{"team": "ml"}
	ws, err := newClient(t).CreateWorkspace(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	info := ws.Info()
	if info.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || info.GetGeneration() != 1 {
		t.Errorf("workspace = %v, want AVAILABLE at generation 1", info)
	}
	want := &ctrlv1.ResourceRequest{CpuMillis: 500, MemoryBytes: 128 << 20, WritableLayerBytes: 64 << 20}
	if got := info.GetSpec().GetResources(); !proto.Equal(got, want) {
		t.Errorf("resources = %v, want %v", got, want)
	}
	if info.GetSpec().GetTemplate().GetTemplateId() != "base" || info.GetLabels()["team"] != "ml" {
		t.Errorf("template %v, labels %v", info.GetSpec().GetTemplate(), info.GetLabels())
	}
}

func TestWorkspaceNotFound(t *testing.T) {
	_, err := newClient(t).Workspace(t.Context(), "ws_06h38fjb8dr6d00n3d7fkxjf2m")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("err = %v, want not_found", err)
	}
}

func TestExecStreamsOutput(t *testing.T) {
	ws := newWorkspace(t)
	var out, errOut testutil.SyncBuffer
	status, err := ws.Exec(t.Context(), []string{"sh", "-c", `printf "out1 $A "; printf err1 >&2; pwd; id -u; exit 3`}, sdk.ExecOptions{
		Env: map[string]string{"A": "1"}, Cwd: "/tmp", User: "root", Tag: "t",
		Stdout: &out, Stderr: &errOut,
	})
	if err != nil {
		t.Fatal(err)
	}
	if status != (sdk.ExitStatus{Code: 3}) || status.Success() {
		t.Errorf("status = %v, want exit status 3", status)
	}
	if got, want := out.String(), "out1 1 /tmp\n0\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got := errOut.String(); got != "err1" {
		t.Errorf("stderr = %q, want err1", got)
	}
	procs, err := ws.Processes(t.Context())
	if err != nil || len(procs) != 1 || procs[0].GetTag() != "t" {
		t.Errorf("processes = %v, %v; want one tagged t", procs, err)
	}

	// With a terminal, of the size asked for.
	var tty bytes.Buffer
	if _, err := ws.Exec(t.Context(), []string{"stty", "size"}, sdk.ExecOptions{Stdout: &tty, PTY: &sdk.PTYSize{Cols: 80, Rows: 24}}); err != nil || tty.String() != "24 80\r\n" {
		t.Errorf("stty size in a PTY = %q, %v", tty.String(), err)
	}
}

// failingWriter takes its first write and fails the others.
type failingWriter struct{ writes int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.writes++; w.writes > 1 {
		return 0, errors.New("sink closed")
	}
	return len(p), nil
}

// TestExecLeavesNothingRunning: an Exec that cannot follow its process
// (here its output cannot be written) fails and kills the process.
func TestExecLeavesNothingRunning(t *testing.T) {
	ws := newWorkspace(t)
	_, err := ws.Exec(t.Context(), []string{"sh", "-c", "echo $$ > /tmp/ticker; while true; do echo tick; sleep 0.1; done"},
		sdk.ExecOptions{Stdout: &failingWriter{}})
	if err == nil || !strings.Contains(err.Error(), "sink closed") {
		t.Fatalf("Exec with a failing stdout: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if sh(t, ws, "kill -0 $(cat /tmp/ticker) 2>/dev/null && echo running || echo gone") == "gone\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process of the failed Exec still runs")
		}
	}
}

// blockingWriter ends the Exec's context at its first write, and blocks
// every write until release closes.
type blockingWriter struct {
	cancel  context.CancelFunc
	release chan struct{}
}

func (w blockingWriter) Write(p []byte) (int, error) {
	w.cancel()
	<-w.release
	return len(p), nil
}

// slowWriter takes 20 ms for each write, as a slow terminal or pipe, and
// says whether a write is under way.
type slowWriter struct {
	writing atomic.Bool
	written atomic.Int64
}

func (w *slowWriter) Write(p []byte) (int, error) {
	w.writing.Store(true)
	defer w.writing.Store(false)
	time.Sleep(20 * time.Millisecond)
	w.written.Add(int64(len(p)))
	return len(p), nil
}

// TestExecEndsWithItsContextWhileStdoutBlocks: when its context ends,
// Exec kills the process and returns even while the caller's stdout
// blocks, which nothing can interrupt; a writer that is merely slow has no
// write under way once Exec returned.
func TestExecEndsWithItsContextWhileStdoutBlocks(t *testing.T) {
	ws := newWorkspace(t)
	const ticker = "echo $$ > /tmp/ticker; while true; do echo tick; sleep 0.01; done"
	release := make(chan struct{})
	defer close(release)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ws.Exec(ctx, []string{"sh", "-c", ticker}, sdk.ExecOptions{Stdout: blockingWriter{cancel, release}})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Exec whose context ended: %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Exec did not return when its context ended while its stdout blocked")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if sh(t, ws, "kill -0 $(cat /tmp/ticker) 2>/dev/null && echo running || echo gone") == "gone\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process of the Exec whose context ended still runs")
		}
	}

	slow := &slowWriter{}
	ctx, cancel = context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := ws.Exec(ctx, []string{"sh", "-c", ticker}, sdk.ExecOptions{Stdout: slow}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec past its deadline: %v", err)
	}
	if slow.writing.Load() {
		t.Error("a write to stdout was under way when Exec returned")
	}
	if slow.written.Load() == 0 {
		t.Error("the slow writer got nothing")
	}
}

func TestExecSendsStdinThenCloses(t *testing.T) {
	ws := newWorkspace(t)
	// More than one SendInput's worth (the SDK sends 32 KiB at most).
	in := strings.Repeat("x", 64<<10) + "tail"
	var out bytes.Buffer
	status, err := ws.Exec(t.Context(), []string{"cat"}, sdk.ExecOptions{Stdin: strings.NewReader(in), Stdout: &out})
	if err != nil || !status.Success() {
		t.Fatalf("Exec = %v, %v (cat ends only when its input is closed)", status, err)
	}
	if out.String() != in {
		t.Errorf("stdout has %d bytes, want the %d of the input", out.Len(), len(in))
	}
}

// failingReader gives one line, then fails.
type failingReader struct{ sent bool }

var errDiskOnFire = errors.New("disk on fire")

func (r *failingReader) Read(b []byte) (int, error) {
	if !r.sent {
		r.sent = true
		return copy(b, "first line\n"), nil
	}
	time.Sleep(100 * time.Millisecond)
	return 0, errDiskOnFire
}

// TestExecWithAFailingStdin: a Stdin whose Read fails closes the
// process's input; Exec returns the exit status with that error, and
// sends no kill to a process that exited.
func TestExecWithAFailingStdin(t *testing.T) {
	ws := newWorkspace(t)
	var out bytes.Buffer
	st, err := ws.Exec(t.Context(), []string{"sh", "-c", "cat; exit 3"}, sdk.ExecOptions{Stdin: &failingReader{}, Stdout: &out})
	if !errors.Is(err, errDiskOnFire) || strings.Contains(err.Error(), "kill") || st.Code != 3 {
		t.Errorf("Exec = %v, %v; want exit status 3 with the read's error alone", st, err)
	}
	if out.String() != "first line\n" {
		t.Errorf("stdout %q, want the line read before the failure", out.String())
	}
}

func TestStartAndConnect(t *testing.T) {
	ws := newWorkspace(t)
	p, err := ws.Start(t.Context(), []string{"sh", "-c", "exit 3"}, sdk.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid() <= 1 {
		t.Errorf("pid = %d", p.Pid())
	}
	if st, err := p.Wait(); err != nil || st.Code != 3 {
		t.Errorf("Wait = %v, %v", st, err)
	}

	p, err = ws.Start(t.Context(), []string{"sh", "-c", "printf buffered; kill -KILL $$"}, sdk.ExecOptions{Tag: "build"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	built := p.Pid()
	var out bytes.Buffer
	p, err = ws.Connect(t.Context(), sdk.Tag("build"), &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil || st.Signal != "SIGKILL" || out.String() != "buffered" {
		t.Errorf("Connect: %v, %v, output %q", st, err, out.String())
	}
	if p.Pid() != built {
		t.Errorf("Connect by tag: pid %d, want %d", p.Pid(), built)
	}
	// The tag is free once its process ended: the handle that found the
	// ended one by tag acts on it, not on the tag's new process.
	next, err := ws.Start(t.Context(), []string{"sleep", "30"}, sdk.ExecOptions{Tag: "build"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(t.Context()); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("Kill of the ended process Connect found by tag: %v; want failed_precondition (it has ended)", err)
	}
	if err := next.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, err := next.Wait(); err != nil || st.Signal != "SIGKILL" {
		t.Errorf("the tag's new process: %v, %v", st, err)
	}

	p, _ = ws.Connect(t.Context(), sdk.Tag("nope"), nil, nil)
	if _, err := p.Wait(); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Connect to an unknown process: %v, want not_found", err)
	}
}

func TestUploadAndDownload(t *testing.T) {
	ws := newWorkspace(t)
	data := make([]byte, 2*sdk.ChunkSize+sdk.ChunkSize/2)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var progress []int64
	info, err := ws.Upload(t.Context(), bytes.NewReader(data), "/tmp/data", 0o600, sdk.AsUser("root"),
		sdk.WithProgress(func(n int64) { progress = append(progress, n) }))
	if err != nil {
		t.Fatal(err)
	}
	if info.GetSize() != uint64(len(data)) {
		t.Errorf("size = %d", info.GetSize())
	}
	checkProgress(t, progress, int64(len(data)))
	if got := sh(t, ws, "stat -c '%a %U' /tmp/data"); got != "600 root\n" {
		t.Errorf("stat = %q", got)
	}
	var back bytes.Buffer
	progress = nil
	var fi *datav1.FileInfo
	n, err := ws.Download(t.Context(), "/tmp/data", &back, sdk.WithFileInfo(func(f *datav1.FileInfo) { fi = f }),
		sdk.WithProgress(func(n int64) { progress = append(progress, n) }))
	if err != nil || n != int64(len(data)) || !bytes.Equal(back.Bytes(), data) {
		t.Errorf("Download = %d, %v; the bytes differ: %v", n, err, !bytes.Equal(back.Bytes(), data))
	}
	checkProgress(t, progress, int64(len(data)))
	if fi.GetSize() != uint64(len(data)) || fi.GetMode() != 0o600 || fi.GetOwner() != "root" {
		t.Errorf("WithFileInfo gave %v", fi)
	}

	// A reader that does not tell its length goes as a chunked body.
	if _, err := ws.Upload(t.Context(), io.MultiReader(bytes.NewReader(data)), "/tmp/chunked", 0); err != nil {
		t.Fatal(err)
	}
	if b, err := ws.ReadFile(t.Context(), "/tmp/chunked"); err != nil || !bytes.Equal(b, data) {
		t.Errorf("ReadFile of the chunked upload: %d bytes, %v", len(b), err)
	}
	if _, err := ws.ReadFile(t.Context(), "/nope"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("ReadFile of a missing file: %v, want not_found", err)
	}

	// An upload whose reader fails after a chunk is never committed: the
	// file keeps its bytes.
	broken := io.MultiReader(bytes.NewReader(make([]byte, sdk.ChunkSize+1)), iotest.ErrReader(errors.New("disk gone")))
	if _, err := ws.Upload(t.Context(), broken, "/tmp/data", 0); err == nil || !strings.Contains(err.Error(), "disk gone") {
		t.Errorf("Upload from a failing reader: %v", err)
	}
	// The agent removes its temporary file once it sees the stream end,
	// which may come after Upload has returned.
	want := fmt.Sprintf("%d\n0\n", len(data))
	got := sh(t, ws, "stat -c %s /tmp/data; ls -a /tmp | grep -c kibotos || true")
	for deadline := time.Now().Add(10 * time.Second); got != want && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		got = sh(t, ws, "stat -c %s /tmp/data; ls -a /tmp | grep -c kibotos || true")
	}
	if got != want {
		t.Errorf("after an abandoned upload: size and temp files %q", got)
	}
}

// A file that shrinks while it is downloaded ends the download aborted,
// saying so, not as a broken connection to retry.
func TestDownloadOfAShrinkingFile(t *testing.T) {
	ws := newWorkspace(t)
	sh(t, ws, "truncate -s 2G /tmp/shrinks")
	shrunk := false
	dst := writerFunc(func(b []byte) (int, error) {
		if !shrunk {
			shrunk = true
			sh(t, ws, "truncate -s 1M /tmp/shrinks")
		}
		return len(b), nil
	})
	_, err := ws.Download(t.Context(), "/tmp/shrinks", dst)
	if connect.CodeOf(err) != connect.CodeAborted || !strings.Contains(err.Error(), "/tmp/shrinks changed while it was read (2147483648 bytes when the read began, 1048576 now)") {
		t.Errorf("Download of a file that shrank: %v, want aborted saying it changed", err)
	}
}

// checkProgress checks WithProgress's reports of a transfer of total
// bytes: a report a chunk, the last the total.
func checkProgress(t *testing.T, progress []int64, total int64) {
	t.Helper()
	ok := len(progress) > 0 && progress[len(progress)-1] == total
	var prev int64
	for i, p := range progress {
		ok = ok && (p-prev >= sdk.ChunkSize || i == len(progress)-1 && p > prev)
		prev = p
	}
	if !ok {
		t.Errorf("progress = %v, want at most one report a chunk of %d, the last %d", progress, sdk.ChunkSize, total)
	}
}

// TestWorkspaceWithSession makes handles from a session issued before:
// one still valid serves their calls as it is, one the data plane refuses
// is replaced by a session the handle issues, and one of another workspace
// is not used: a workspace that does not exist is NotFound.
func TestWorkspaceWithSession(t *testing.T) {
	c := newClient(t)
	ws, err := c.CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ws.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	h := c.WorkspaceWithSession(ws.ID(), s)
	if h.CurrentSession() != s || h.Info() != nil {
		t.Fatalf("handle holds %v (info %v), want the session given", h.CurrentSession(), h.Info())
	}
	if out := sh(t, h, "echo given"); out != "given\n" {
		t.Fatalf("exec with the given session: %q", out)
	}
	if got := h.CurrentSession(); got.ID != s.ID {
		t.Errorf("after a call the handle holds session %s, want the given %s", got.ID, s.ID)
	}

	// A MAC that does not verify: the gateway refuses the token.
	bogus := *s
	bogus.Token = tamper(s.Token)
	h = c.WorkspaceWithSession(ws.ID(), &bogus)
	if h.CurrentSession() == nil {
		t.Fatal("the handle dropped a session token of its workspace")
	}
	if out := sh(t, h, "echo renewed"); out != "renewed\n" {
		t.Fatalf("exec with a refused session: %q", out)
	}
	if got := h.CurrentSession(); got == nil || got.Token == bogus.Token || got.ID == s.ID {
		t.Errorf("after a refusal the handle holds %+v, want a session of its own", got)
	}

	// An endpoint nothing answers on, as when the Workspace has moved to
	// another host: the handle asks for a session naming where it runs now.
	moved := *s
	moved.Endpoint = testutil.ClosedURL(t)
	h = c.WorkspaceWithSession(ws.ID(), &moved)
	if out := sh(t, h, "echo moved"); out != "moved\n" {
		t.Fatalf("exec with a session of an endpoint that does not answer: %q", out)
	}
	if got := h.CurrentSession(); got == nil || got.Endpoint != s.Endpoint {
		t.Errorf("after an unreachable endpoint the handle holds %+v, want a session of %s", got, s.Endpoint)
	}

	// An endpoint that runs the call and loses its answer (a proxy that
	// answers 502 once the data plane has answered): the call is not
	// sent again, which would run it twice.
	target, err := url.Parse(s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	lossy := testutil.H2CServer(t, &httputil.ReverseProxy{
		Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:      sdk.NewTransport(nil),
		ModifyResponse: func(*http.Response) error { return errors.New("the answer is lost") },
	})
	cut := *s
	cut.Endpoint = lossy.URL
	h = c.WorkspaceWithSession(ws.ID(), &cut)
	if _, err := h.Exec(t.Context(), []string{"sh", "-c", "echo ran >> /root/lossy"}, sdk.ExecOptions{}); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("exec through an endpoint that lost the answer: %v, want unavailable", err)
	}
	if out := sh(t, ws, "sleep 0.5; cat /root/lossy"); out != "ran\n" {
		t.Errorf("the command ran %q, want once", out)
	}

	_, err = c.WorkspaceWithSession("ws_06h38fjb8dr6d00n3d7fkxjf2m", s).Exec(t.Context(), []string{"true"}, sdk.ExecOptions{})
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("exec in a workspace that does not exist: %v, want not_found", err)
	}
}

// tamper returns a session token whose MAC does not verify: its first
// character, which carries six bits of the MAC, changed.
func tamper(token string) string {
	i := strings.LastIndexByte(token, '.') + 1
	c := byte('A')
	if token[i] == c {
		c = 'B'
	}
	return token[:i] + string(c) + token[i+1:]
}

// TestEndWithCallerEndsWithADeadCaller: a process started with
// EndWithCaller is killed once its caller's connections are cut, as when
// the caller is killed; one fed from stdin would otherwise wait for ever
// (a `ws cp -r` whose CLI was killed left its tar so).
func TestEndWithCallerEndsWithADeadCaller(t *testing.T) {
	d := uptest.Shared(t)
	token := d.Project(t)
	owner := sdk.New(d.URL+"/", token)
	defer owner.Close()
	ws, err := owner.CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.Protocols = new(http.Protocols)
	base.Protocols.SetUnencryptedHTTP2(true)
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	caller := sdk.New(d.URL+"/", token, sdk.WithHTTPClient(&http.Client{Transport: base}))
	defer caller.Close()
	handle, err := caller.Workspace(t.Context(), ws.ID())
	if err != nil {
		t.Fatal(err)
	}
	stdin, feed := io.Pipe()
	defer feed.Close()
	if _, err := handle.Start(t.Context(), []string{"sh", "-c", "cat > /dev/null"}, sdk.ExecOptions{Stdin: stdin, Tag: "fed", EndWithCaller: true}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, c := range conns { // the caller dies
		c.Close()
	}
	mu.Unlock()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		procs, err := ws.Processes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(procs, func(p *datav1.ProcessInfo) bool { return p.GetTag() == "fed" })
		if i >= 0 && procs[i].GetExited().GetSignal() == "SIGKILL" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process of a caller that died: %v, want it killed", procs)
		}
	}
}
