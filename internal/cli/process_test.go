package cli

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/sdk"
)

// dataFake is an AVAILABLE Workspace ws_1 whose sessions name the same
// server as their data plane, with a guest of a few files and processes.
type dataFake struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	ctrlv1connect.UnimplementedSessionServiceHandler
	datav1connect.UnimplementedProcessServiceHandler
	datav1connect.UnimplementedFileServiceHandler

	endpoint string

	mu      sync.Mutex
	started *datav1.StartProcessRequest
	input   []string
	closed  chan struct{}
	files   map[string][]byte // the guest's files
	dirs    map[string]bool   // the guest's directories
	links   map[string]string // the guest's symlinks: path to target path
	modes   map[string]uint32 // WriteFile modes, by path
}

func newDataEnv(t *testing.T) (*env, *dataFake) {
	t.Helper()
	f := &dataFake{
		closed: make(chan struct{}),
		files:  map[string][]byte{},
		dirs:   map[string]bool{"/work": true},
		links:  map[string]string{},
		modes:  map[string]uint32{},
	}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(f))
	mux.Handle(ctrlv1connect.NewSessionServiceHandler(f))
	mux.Handle(datav1connect.NewProcessServiceHandler(f))
	mux.Handle(datav1connect.NewFileServiceHandler(f))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	f.endpoint = "http://" + srv.Listener.Addr().String()
	srv.Start()
	t.Cleanup(srv.Close)

	home := t.TempDir()
	t.Setenv(envAddr, "")
	t.Setenv(envToken, "")
	t.Setenv(envHome, home)
	return &env{addr: srv.URL, home: home, token: "tok"}, f
}

func (f *dataFake) GetWorkspace(_ context.Context, r *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	if r.Msg.GetWorkspaceId() != "ws_1" {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("workspace "+r.Msg.GetWorkspaceId()+" not found"))
	}
	return connect.NewResponse(&ctrlv1.GetWorkspaceResponse{Workspace: &ctrlv1.Workspace{WorkspaceId: "ws_1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE}}), nil
}

func (f *dataFake) IssueSession(context.Context, *connect.Request[ctrlv1.IssueSessionRequest]) (*connect.Response[ctrlv1.IssueSessionResponse], error) {
	return connect.NewResponse(&ctrlv1.IssueSessionResponse{SessionId: "ses_1", Token: "sess", Endpoint: f.endpoint}), nil
}

// StartProcess runs `exit N`, `kill SIG` and `cat`, the last echoing its
// input once it is closed.
func (f *dataFake) StartProcess(ctx context.Context, r *connect.Request[datav1.StartProcessRequest], s *connect.ServerStream[datav1.ProcessEvent]) error {
	f.mu.Lock()
	f.started = r.Msg
	f.mu.Unlock()
	args := r.Msg.GetArgs()
	if args[0] != "exit" && args[0] != "kill" && args[0] != "cat" {
		return connect.NewError(connect.CodeNotFound, errors.New(args[0]+": command not found"))
	}
	if err := s.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Started_{Started: &datav1.ProcessEvent_Started{Pid: 7}}}); err != nil {
		return err
	}
	exited := &datav1.ProcessEvent_Exited{}
	var out []byte
	switch args[0] {
	case "exit":
		exited.ExitCode = int32(len(args[1])) // exit 1234567 exits 7
	case "kill":
		exited.Signal = args[1]
	case "cat":
		select {
		case <-f.closed:
		case <-ctx.Done():
			return ctx.Err()
		}
		f.mu.Lock()
		out = []byte(strings.Join(f.input, ""))
		f.mu.Unlock()
	}
	for _, ev := range []*datav1.ProcessEvent{
		{Event: &datav1.ProcessEvent_Stdout{Stdout: append([]byte("out:"), out...)}},
		{Event: &datav1.ProcessEvent_Stderr{Stderr: []byte("err")}},
		{Event: &datav1.ProcessEvent_Exited_{Exited: exited}},
	} {
		if err := s.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

func (f *dataFake) SendInput(_ context.Context, r *connect.Request[datav1.SendInputRequest]) (*connect.Response[datav1.SendInputResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.input = append(f.input, string(r.Msg.GetData()))
	return connect.NewResponse(&datav1.SendInputResponse{}), nil
}

func (f *dataFake) CloseInput(context.Context, *connect.Request[datav1.CloseInputRequest]) (*connect.Response[datav1.CloseInputResponse], error) {
	close(f.closed)
	return connect.NewResponse(&datav1.CloseInputResponse{}), nil
}

var processes = []*datav1.ProcessInfo{
	{Pid: 7, Tag: "web", Args: []string{"python3", "-m", "http.server"}, User: "dev", StartedAt: created},
	{Pid: 9, Args: []string{"make"}, Pty: true, StartedAt: created, Exited: &datav1.ProcessEvent_Exited{ExitCode: 2}},
	{Pid: 11, Args: []string{"sleep", "99"}, StartedAt: timestamppb.New(created.AsTime().Add(1e9)), Exited: &datav1.ProcessEvent_Exited{Signal: "SIGKILL"}},
}

func (f *dataFake) ListProcesses(context.Context, *connect.Request[datav1.ListProcessesRequest]) (*connect.Response[datav1.ListProcessesResponse], error) {
	return connect.NewResponse(&datav1.ListProcessesResponse{Processes: processes}), nil
}

// ConnectProcess replays "buffered" for pid 9, which ended, and for web,
// which runs on and prints nothing more.
func (f *dataFake) ConnectProcess(ctx context.Context, r *connect.Request[datav1.ConnectProcessRequest], s *connect.ServerStream[datav1.ProcessEvent]) error {
	sel := r.Msg.GetProcess()
	switch {
	case sel.GetPid() == 9:
		if err := s.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte("buffered\n")}}); err != nil {
			return err
		}
		return s.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Exited_{Exited: &datav1.ProcessEvent_Exited{ExitCode: 2}}})
	case sel.GetTag() == "web":
		if err := s.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Stdout{Stdout: []byte("serving\n")}}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return connect.NewError(connect.CodeNotFound, errors.New("no such process"))
}

func (f *dataFake) WriteFile(_ context.Context, s *connect.ClientStream[datav1.WriteFileRequest]) (*connect.Response[datav1.WriteFileResponse], error) {
	var (
		start *datav1.WriteFileStart
		data  []byte
	)
	for s.Receive() {
		switch p := s.Msg().GetPart().(type) {
		case *datav1.WriteFileRequest_Start:
			start = p.Start
		case *datav1.WriteFileRequest_Data:
			data = append(data, p.Data...)
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[start.GetPath()] = data
	f.modes[start.GetPath()] = start.GetMode()
	return connect.NewResponse(&datav1.WriteFileResponse{File: &datav1.FileInfo{Path: start.GetPath(), Size: uint64(len(data))}}), nil
}

func (f *dataFake) InspectFile(_ context.Context, r *connect.Request[datav1.InspectFileRequest]) (*connect.Response[datav1.InspectFileResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := r.Msg.GetPath()
	switch data, ok := f.files[p]; {
	case f.links[p] != "":
		return connect.NewResponse(&datav1.InspectFileResponse{File: &datav1.FileInfo{Path: p, Type: datav1.FileType_FILE_TYPE_SYMLINK, Mode: 0o777, SymlinkTarget: f.links[p]}}), nil
	case f.dirs[p]:
		return connect.NewResponse(&datav1.InspectFileResponse{File: &datav1.FileInfo{Path: p, Type: datav1.FileType_FILE_TYPE_DIRECTORY, Mode: 0o755}}), nil
	case ok:
		return connect.NewResponse(&datav1.InspectFileResponse{File: &datav1.FileInfo{Path: p, Type: datav1.FileType_FILE_TYPE_FILE, Size: uint64(len(data)), Mode: 0o750}}), nil
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New(p+": no such file or directory"))
}

func (f *dataFake) ReadFile(_ context.Context, r *connect.Request[datav1.ReadFileRequest], s *connect.ServerStream[datav1.ReadFileResponse]) error {
	f.mu.Lock()
	p := cmp.Or(f.links[r.Msg.GetPath()], r.Msg.GetPath())
	data, ok := f.files[p]
	f.mu.Unlock()
	if !ok {
		return connect.NewError(connect.CodeNotFound, errors.New("no such file"))
	}
	// As the guest does: the first message describes the file read.
	msg := &datav1.ReadFileResponse{File: &datav1.FileInfo{Path: r.Msg.GetPath(), Type: datav1.FileType_FILE_TYPE_FILE, Size: uint64(len(data)), Mode: 0o750}}
	for len(data) > 0 {
		n := min(len(data), 3)
		msg.Data = data[:n]
		if err := s.Send(msg); err != nil {
			return err
		}
		data, msg = data[n:], &datav1.ReadFileResponse{}
	}
	return nil
}

// runData runs `kibotos args...` against the fake with a token.
func (e *env) runData(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return e.run(t, stdin, append([]string{args[0], args[1], "--addr", e.addr, "--token", "tok"}, args[2:]...)...)
}

func TestExecPropagatesExitCode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"exit", "x"}, 1},
		{[]string{"exit", "1234567"}, 7},
		{[]string{"kill", "SIGKILL"}, 137},
		{[]string{"kill", "TERM"}, 143},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			e, _ := newDataEnv(t)
			stdout, stderr, err := e.runData(t, "", append([]string{"ws", "exec", "ws_1", "--"}, tc.args...)...)
			var exit *ExitError
			if !errors.As(err, &exit) || exit.Code != tc.want {
				t.Fatalf("err = %v, want exit status %d", err, tc.want)
			}
			if stdout != "out:" || stderr != "err" {
				t.Errorf("stdout %q, stderr %q", stdout, stderr)
			}
		})
	}
}

func TestExecSendsOptionsAndStdin(t *testing.T) {
	e, f := newDataEnv(t)
	stdout, _, err := e.runData(t, "hello\nworld\n", "ws", "exec", "-i", "--user", "dev", "--cwd", "/work", "--env", "A=1", "--env", "B=x=y", "ws_1", "--", "cat", "-")
	if err != nil {
		t.Fatal(err)
	}
	if stdout != "out:hello\nworld\n" {
		t.Errorf("stdout = %q", stdout)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.started
	if strings.Join(r.GetArgs(), " ") != "cat -" || r.GetUser() != "dev" || r.GetCwd() != "/work" || !r.GetStdin() || r.GetPty() != nil ||
		len(r.GetEnv()) != 2 || r.GetEnv()["B"] != "x=y" {
		t.Errorf("request = %v", r)
	}
}

func TestExecTTYAsksForPTY(t *testing.T) {
	e, f := newDataEnv(t)
	t.Setenv("TERM", "vt100")
	if _, _, err := e.runData(t, "", "ws", "exec", "-t", "ws_1", "exit", "x"); err == nil {
		t.Fatal("exit 1 succeeded")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if pty := f.started.GetPty(); pty.GetCols() != uint32(defaultPTY.Cols) || pty.GetRows() != uint32(defaultPTY.Rows) || f.started.GetStdin() {
		t.Errorf("pty = %v, stdin = %v", pty, f.started.GetStdin())
	}
	if f.started.GetEnv()["TERM"] != "vt100" {
		t.Errorf("env = %v, want TERM from here", f.started.GetEnv())
	}
}

func TestExecUnknownWorkspace(t *testing.T) {
	e, _ := newDataEnv(t)
	_, _, err := e.runData(t, "", "ws", "exec", "ws_2", "exit", "")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("err = %v, want not_found", err)
	}
}

func TestCpUpload(t *testing.T) {
	e, f := newDataEnv(t)
	local := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(local, []byte("some notes"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ src, dst, path, data string }{
		{local, "ws_1:/work/a.txt", "/work/a.txt", "some notes"},
		{local, "ws_1:/work", "/work/notes.txt", "some notes"},
		{"-", "ws_1:/work/in", "/work/in", "from stdin"},
	} {
		if _, _, err := e.runData(t, "from stdin", "ws", "cp", tc.src, tc.dst); err != nil {
			t.Fatalf("cp %s %s: %v", tc.src, tc.dst, err)
		}
		f.mu.Lock()
		if got := string(f.files[tc.path]); got != tc.data {
			t.Errorf("cp %s %s: %s holds %q, want %q", tc.src, tc.dst, tc.path, got, tc.data)
		}
		f.mu.Unlock()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.modes["/work/a.txt"] != 0o640 || f.modes["/work/in"] != 0 {
		t.Errorf("modes = %v", f.modes)
	}
}

func TestCpDownload(t *testing.T) {
	e, f := newDataEnv(t)
	f.files["/work/out.bin"] = []byte("0123456789")
	dir := t.TempDir()
	if _, _, err := e.runData(t, "", "ws", "cp", "ws_1:/work/out.bin", dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "out.bin")
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "0123456789" {
		t.Errorf("%s = %q, %v", path, got, err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o750 {
		t.Errorf("mode = %v, want the remote 0750", st.Mode())
	}

	stdout, _, err := e.runData(t, "", "ws", "cp", "ws_1:/work/out.bin", "-")
	if err != nil || stdout != "0123456789" {
		t.Errorf("cp to stdout = %q, %v", stdout, err)
	}

	// A symlink is copied as the file it leads to, with that file's mode.
	f.links["/work/link"] = "/work/out.bin"
	if _, _, err := e.runData(t, "", "ws", "cp", "ws_1:/work/link", dir); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if got, err := os.ReadFile(link); err != nil || string(got) != "0123456789" {
		t.Errorf("%s = %q, %v", link, got, err)
	}
	if st, _ := os.Stat(link); st.Mode().Perm() != 0o750 {
		t.Errorf("the symlink's copy: mode %v, want its target's 0750", st.Mode())
	}
	os.Remove(link)

	// A failed copy leaves no file behind.
	_, _, err = e.runData(t, "", "ws", "cp", "ws_1:/work/missing", filepath.Join(dir, "m"))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("err = %v, want not_found", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%s holds %d entries, want out.bin alone", dir, len(entries))
	}
}

func TestCpRejectsOperands(t *testing.T) {
	e, _ := newDataEnv(t)
	for _, args := range [][]string{
		{"a", "b"},
		{"ws_1:/a", "ws_1:/b"},
		{"a", "ws_1:"},
		{"-", "ws_1:/work"},
	} {
		if _, _, err := e.runData(t, "", append([]string{"ws", "cp"}, args...)...); err == nil {
			t.Errorf("cp %v succeeded", args)
		}
	}
	if op, _ := parseCpOperand("./a:b"); op.ws != "" {
		t.Errorf("./a:b read as workspace %q", op.ws)
	}
}

func TestPs(t *testing.T) {
	e, _ := newDataEnv(t)
	stdout, _, err := e.runData(t, "", "ws", "ps", "ws_1")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(strings.TrimRight(stdout, "\n"), "\n") {
		rows = append(rows, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"PID TAG USER PTY STARTED EXIT COMMAND",
		"7 web dev false 2025-03-01T12:00:00Z - python3 -m http.server",
		"9 - - true 2025-03-01T12:00:00Z 2 make",
		"11 - - false 2025-03-01T12:00:01Z SIGKILL sleep 99",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("ps:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}

	stdout, _, err = e.runData(t, "", "ws", "ps", "ws_1", "-o", "json")
	var resp datav1.ListProcessesResponse
	if err != nil || protojson.Unmarshal([]byte(stdout), &resp) != nil || len(resp.GetProcesses()) != 3 {
		t.Errorf("ps -o json = %s, %v", stdout, err)
	}
}

func TestLogs(t *testing.T) {
	e, _ := newDataEnv(t)
	// An ended process: its buffered output, then the exit.
	stdout, _, err := e.runData(t, "", "ws", "logs", "ws_1", "9")
	if err != nil || stdout != "buffered\n" {
		t.Errorf("logs 9 = %q, %v", stdout, err)
	}
	// A running one: what it buffered, until it falls silent.
	stdout, _, err = e.runData(t, "", "ws", "logs", "ws_1", "web")
	if err != nil || stdout != "serving\n" {
		t.Errorf("logs web = %q, %v", stdout, err)
	}
	_, _, err = e.runData(t, "", "ws", "logs", "ws_1", "nope", "-f")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("logs nope = %v, want not_found", err)
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		s    sdk.ExitStatus
		want int
	}{
		{sdk.ExitStatus{}, 0},
		{sdk.ExitStatus{Code: 42}, 42},
		{sdk.ExitStatus{Signal: "SIGINT"}, 130},
		{sdk.ExitStatus{Signal: "kill"}, 137},
		{sdk.ExitStatus{Signal: "SIGBOGUS"}, 255},
	} {
		if got := exitCode(tc.s); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.s, got, tc.want)
		}
	}
}
