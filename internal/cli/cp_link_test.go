package cli

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
)

// linkGuest is Workspace ws_1 whose guest holds files and symlinks, on one
// server that is its control and data plane.
type linkGuest struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	ctrlv1connect.UnimplementedSessionServiceHandler
	datav1connect.UnimplementedFileServiceHandler

	endpoint string
	files    map[string]*datav1.FileInfo
	data     map[string]string // contents, by the path a link resolves to
}

func (g *linkGuest) GetWorkspace(context.Context, *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	return connect.NewResponse(&ctrlv1.GetWorkspaceResponse{Workspace: &ctrlv1.Workspace{WorkspaceId: "ws_1", State: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE}}), nil
}

func (g *linkGuest) IssueSession(context.Context, *connect.Request[ctrlv1.IssueSessionRequest]) (*connect.Response[ctrlv1.IssueSessionResponse], error) {
	return connect.NewResponse(&ctrlv1.IssueSessionResponse{SessionId: "ses_1", Token: "sess", Endpoint: g.endpoint}), nil
}

// InspectFile does not follow a final symlink, as the guest's does not.
func (g *linkGuest) InspectFile(_ context.Context, r *connect.Request[datav1.InspectFileRequest]) (*connect.Response[datav1.InspectFileResponse], error) {
	if info, ok := g.files[r.Msg.GetPath()]; ok {
		return connect.NewResponse(&datav1.InspectFileResponse{File: info}), nil
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New(r.Msg.GetPath()+": no such file or directory"))
}

// ReadFile follows symlinks, as the guest's open does.
func (g *linkGuest) ReadFile(_ context.Context, r *connect.Request[datav1.ReadFileRequest], s *connect.ServerStream[datav1.ReadFileResponse]) error {
	data, ok := g.data[r.Msg.GetPath()]
	if !ok {
		return connect.NewError(connect.CodeNotFound, errors.New("no such file"))
	}
	return s.Send(&datav1.ReadFileResponse{Data: []byte(data)})
}

// TestCpOfSymlinkGetsTheTargetsMode copies symlinks out of a Workspace: the
// local file gets the mode of the file the link leads to (through relative
// and chained links), never the link's own 0777; a loop fails and writes
// nothing.
func TestCpOfSymlinkGetsTheTargetsMode(t *testing.T) {
	link := func(p, target string) *datav1.FileInfo {
		return &datav1.FileInfo{Path: p, Type: datav1.FileType_FILE_TYPE_SYMLINK, Mode: 0o777, SymlinkTarget: target}
	}
	g := &linkGuest{
		files: map[string]*datav1.FileInfo{
			"/etc/secret":   {Path: "/etc/secret", Type: datav1.FileType_FILE_TYPE_FILE, Mode: 0o600, Size: 6},
			"/bin/tool":     {Path: "/bin/tool", Type: datav1.FileType_FILE_TYPE_FILE, Mode: 0o755, Size: 4},
			"/work/abs":     link("/work/abs", "/etc/secret"),
			"/work/rel":     link("/work/rel", "../bin/tool"),
			"/work/chain":   link("/work/chain", "rel"),
			"/work/loop":    link("/work/loop", "loop2"),
			"/work/loop2":   link("/work/loop2", "/work/loop"),
			"/work/dirlink": link("/work/dirlink", "/work"),
			"/work":         {Path: "/work", Type: datav1.FileType_FILE_TYPE_DIRECTORY, Mode: 0o755},
		},
		data: map[string]string{"/work/abs": "secret", "/work/rel": "tool", "/work/chain": "tool"},
	}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(g))
	mux.Handle(ctrlv1connect.NewSessionServiceHandler(g))
	mux.Handle(datav1connect.NewFileServiceHandler(g))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	g.endpoint = "http://" + srv.Listener.Addr().String()
	srv.Start()
	t.Cleanup(srv.Close)
	t.Setenv(envAddr, "")
	t.Setenv(envToken, "")
	dir := t.TempDir()
	cp := func(src, dst string) error {
		_, err := execute("ws", "cp", "--addr", srv.URL, "--token", "tok", src, dst)
		return err
	}

	for _, tc := range []struct {
		src  string
		mode os.FileMode
		data string
	}{
		{"/work/abs", 0o600, "secret"},
		{"/work/rel", 0o755, "tool"},
		{"/work/chain", 0o755, "tool"},
	} {
		dst := filepath.Join(dir, filepath.Base(tc.src))
		if err := cp("ws_1:"+tc.src, dst); err != nil {
			t.Fatalf("cp %s: %v", tc.src, err)
		}
		st, err := os.Stat(dst)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(dst); st.Mode().Perm() != tc.mode || string(got) != tc.data {
			t.Errorf("cp %s: %v %q, want %v %q", tc.src, st.Mode().Perm(), got, tc.mode, tc.data)
		}
	}
	if err := cp("ws_1:/work/loop", filepath.Join(dir, "loop")); err == nil || !strings.Contains(err.Error(), "too many levels of symbolic links") {
		t.Errorf("cp of a link loop: %v", err)
	}
	if err := cp("ws_1:/work/dirlink", filepath.Join(dir, "d")); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("cp of a link to a directory: %v", err)
	}
	for _, name := range []string{"loop", "d"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("a failed cp left %s: %v", name, err)
		}
	}
}
