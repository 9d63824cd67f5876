package cli

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/testutil"
)

var created = timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))

// ctrlFake serves the WorkspaceService and TemplateService methods the tests
// call, records the requests, and answers from what a test put in it. Tests
// use it for what the real server does not produce on demand: a start that
// FAILED, a watch cut short, workspaces with network faults and volume
// failures of every kind, an import of an archive that is no image, and a
// registry import (the real server would fetch from the registry, and tests
// reach no address but loopback). Its sessions name itself as the data
// plane, which serves a screen and records input: a deployment with a
// display needs the desktop template's image.
type ctrlFake struct {
	ctrlv1connect.UnimplementedWorkspaceServiceHandler
	ctrlv1connect.UnimplementedTemplateServiceHandler
	ctrlv1connect.UnimplementedSessionServiceHandler
	datav1connect.UnimplementedScreenServiceHandler
	datav1connect.UnimplementedInputServiceHandler

	recorder
	proto map[string]int    // HTTP major version, by procedure
	auth  map[string]string // Authorization header, by procedure

	ws    *ctrlv1.Workspace   // returned by the lifecycle calls
	watch []*ctrlv1.Workspace // sent by WatchWorkspace, in order
	// cutWatches are sent by the first WatchWorkspace calls, one list
	// each, which then end unavailable, as a restarting server's do.
	cutWatches [][]*ctrlv1.Workspace

	imported []byte // the chunks of the last import, concatenated
	chunks   int

	endpoint string                        // the server's URL, which sessions name
	screen   *datav1.CaptureScreenResponse // answered by CaptureScreen
}

// recorder keeps the method names and requests a fake is sent, in order;
// its mutex also guards the rest of the fake it is part of.
type recorder struct {
	mu    sync.Mutex
	calls []string
	reqs  []proto.Message
}

func (f *recorder) record(r connect.AnyRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Spec().Procedure[strings.LastIndex(r.Spec().Procedure, "/")+1:])
	f.reqs = append(f.reqs, r.Any().(proto.Message))
}

func (f *recorder) got() ([]string, []proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.reqs
}

func (f *ctrlFake) CreateWorkspace(_ context.Context, r *connect.Request[ctrlv1.CreateWorkspaceRequest]) (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.CreateWorkspaceResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) GetWorkspace(_ context.Context, r *connect.Request[ctrlv1.GetWorkspaceRequest]) (*connect.Response[ctrlv1.GetWorkspaceResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.GetWorkspaceResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) StopWorkspace(_ context.Context, r *connect.Request[ctrlv1.StopWorkspaceRequest]) (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.StopWorkspaceResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) UpdateWorkspaceLabels(_ context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceLabelsRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceLabelsResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceLabelsResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) UpdateWorkspaceMemory(_ context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceMemoryRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceMemoryResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceMemoryResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) ResizeWorkspaceWritableLayer(_ context.Context, r *connect.Request[ctrlv1.ResizeWorkspaceWritableLayerRequest]) (*connect.Response[ctrlv1.ResizeWorkspaceWritableLayerResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) UpdateWorkspaceExpiration(_ context.Context, r *connect.Request[ctrlv1.UpdateWorkspaceExpirationRequest]) (*connect.Response[ctrlv1.UpdateWorkspaceExpirationResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.UpdateWorkspaceExpirationResponse{Workspace: f.ws}), nil
}

func (f *ctrlFake) WatchWorkspace(_ context.Context, r *connect.Request[ctrlv1.WatchWorkspaceRequest], s *connect.ServerStream[ctrlv1.WatchWorkspaceResponse]) error {
	f.record(r)
	f.mu.Lock()
	send, cut := f.watch, len(f.cutWatches) > 0
	if cut {
		send, f.cutWatches = f.cutWatches[0], f.cutWatches[1:]
	}
	f.mu.Unlock()
	for _, ws := range send {
		if err := s.Send(&ctrlv1.WatchWorkspaceResponse{Workspace: ws}); err != nil {
			return err
		}
	}
	if cut {
		return connect.NewError(connect.CodeUnavailable, errors.New("the server is shutting down; watch again"))
	}
	return nil
}

func (f *ctrlFake) IssueSession(_ context.Context, r *connect.Request[ctrlv1.IssueSessionRequest]) (*connect.Response[ctrlv1.IssueSessionResponse], error) {
	f.record(r)
	return connect.NewResponse(&ctrlv1.IssueSessionResponse{SessionId: "s1", Token: "session-token", Endpoint: f.endpoint}), nil
}

func (f *ctrlFake) CaptureScreen(_ context.Context, r *connect.Request[datav1.CaptureScreenRequest]) (*connect.Response[datav1.CaptureScreenResponse], error) {
	f.record(r)
	return connect.NewResponse(f.screen), nil
}

func (f *ctrlFake) DeliverInput(_ context.Context, r *connect.Request[datav1.DeliverInputRequest]) (*connect.Response[datav1.DeliverInputResponse], error) {
	f.record(r)
	return connect.NewResponse(&datav1.DeliverInputResponse{}), nil
}

// env is one test's fake on an h2c server, as internal/server serves.
func newCtrlEnv(t *testing.T) (*env, *ctrlFake) {
	t.Helper()
	f := &ctrlFake{proto: map[string]int{}, auth: map[string]string{}, ws: testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewWorkspaceServiceHandler(f))
	mux.Handle(ctrlv1connect.NewTemplateServiceHandler(f))
	mux.Handle(ctrlv1connect.NewSessionServiceHandler(f))
	mux.Handle(datav1connect.NewScreenServiceHandler(f))
	mux.Handle(datav1connect.NewInputServiceHandler(f))
	srv := testutil.H2CServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		method := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		f.proto[method] = r.ProtoMajor
		f.auth[method] = r.Header.Get("Authorization")
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	f.endpoint = srv.URL

	home := cleanHome(t)
	return &env{addr: srv.URL, home: home, token: "tok"}, f
}

func testWorkspace(state ctrlv1.WorkspaceState) *ctrlv1.Workspace {
	return &ctrlv1.Workspace{
		WorkspaceId: "ws_1",
		State:       state,
		Spec: &ctrlv1.WorkspaceSpec{
			Template:          &ctrlv1.TemplateRef{TemplateId: "base", Revision: "sha256-abc"},
			Resources:         &ctrlv1.ResourceRequest{CpuMillis: 500, MemoryBytes: 1 << 30},
			ResourcesRevision: 3,
		},
		LabelsRevision: 4,
		Labels:         map[string]string{"team": "ml"},
		CreatedAt:      created,
	}
}
