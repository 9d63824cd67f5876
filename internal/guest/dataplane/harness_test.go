package dataplane

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// testEnv is the data plane served in-process over HTTP/2 on a unix
// socket, with generated clients.
type testEnv struct {
	procs  *ProcessService
	files  *FileService
	pc     datav1connect.ProcessServiceClient
	fc     datav1connect.FileServiceClient
	sc     datav1connect.ServiceServiceClient
	screen datav1connect.ScreenServiceClient
	input  datav1connect.InputServiceClient
	// dial connects to the data plane's unix socket; h2 is the HTTP/2
	// transport over it that the clients use.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	h2   *http.Transport
}

// newTestEnv serves a data plane without a display.
func newTestEnv(t testing.TB) *testEnv {
	t.Helper()
	return newDisplayEnv(t, func(*ProcessService) *DisplayService { return NewDisplayService(nil, NoDisplay) })
}

// newDisplayEnv serves a data plane whose display services display
// returns, given the process service.
func newDisplayEnv(t testing.TB, display func(*ProcessService) *DisplayService) *testEnv {
	t.Helper()
	// Processes and files run as other users.
	hosttest.RequireRoot(t)
	e := &testEnv{
		procs: NewProcessService(ProcessConfig{Waiter: ChildWaiter{}, Logf: t.Logf}),
		files: NewFileService(FileConfig{Logf: t.Logf}),
	}
	sock := filepath.Join(t.TempDir(), "data.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(NewHandler(e.procs, e.files, NewServiceService(), display(e.procs)))
	go srv.Serve(ln)
	e.dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	tr := &http.Transport{DialContext: e.dial, Protocols: new(http.Protocols), HTTP2: guestabi.DataSocketHTTP2()}
	tr.Protocols.SetUnencryptedHTTP2(true)
	e.h2 = tr
	hc := &http.Client{Transport: tr}
	e.pc = datav1connect.NewProcessServiceClient(hc, "http://guest")
	e.fc = datav1connect.NewFileServiceClient(hc, "http://guest")
	e.sc = datav1connect.NewServiceServiceClient(hc, "http://guest")
	e.screen = datav1connect.NewScreenServiceClient(hc, "http://guest")
	e.input = datav1connect.NewInputServiceClient(hc, "http://guest")
	t.Cleanup(func() {
		// End what the test started, then the server.
		if err := e.procs.Terminate(time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		e.files.Close()
		tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			srv.Close()
		}
	})
	return e
}

// ctx returns a context that ends with the test or after d.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// wantCode checks that err is a Connect error of code whose ErrorDetail
// names stage.
func wantCode(t *testing.T, err error, code connect.Code, stage ctrlv1.FailureStage) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", code)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("got %v (%T), want a Connect error", err, err)
	}
	if ce.Code() != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	ed := testutil.ErrorDetail(err)
	if ed == nil {
		t.Fatalf("%v: no ErrorDetail with a stage", err)
	}
	if ed.GetStage() != stage {
		t.Fatalf("%v: stage %v, want %v", err, ed.GetStage(), stage)
	}
}

// sharedDir returns a new temp directory that every user may enter.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir() // <tmp>/<TestName><n>/<k>, both made 0700
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// pgroupMembers lists the live (not zombie) processes whose process group
// is pgid.
func pgroupMembers(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid pgrp ...
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}
