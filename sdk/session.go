package sdk

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/sdk/sessiontoken"
)

// renewBefore is how long before its expiry a cached session is replaced,
// or half its lifetime when that is shorter: a session of 30 s or less
// would otherwise be replaced at every call.
const renewBefore = 30 * time.Second

// Session is a data-plane session of a Workspace: a bearer token for the
// kibotos.data.v1 services at Endpoint, until ExpiresAt.
type Session struct {
	ID       string
	Token    string
	Endpoint string
	// ExpiresAt is zero when the server did not say.
	ExpiresAt time.Time
}

// dataPlane is one session and the data-plane clients that use it.
type dataPlane struct {
	session *Session
	// generation is the run of the Workspace the session reaches (its
	// token says); 0 when the token does not parse.
	generation uint64
	// renewBefore is how long before its expiry the session is replaced:
	// the package's renewBefore, or half of what the session had left
	// when it came.
	renewBefore time.Duration
	// given is set on a session the handle was made with
	// (WorkspaceWithSession), not one it issued.
	given    bool
	proc     datav1connect.ProcessServiceClient
	files    datav1connect.FileServiceClient
	metrics  datav1connect.MetricsServiceClient
	services datav1connect.ServiceServiceClient
	screen   datav1connect.ScreenServiceClient
	input    datav1connect.InputServiceClient
	// fileBytes is whether the endpoint serves FileBytesPath:
	// fileBytesUnknown until a call tells.
	fileBytes atomic.Int32
}

// Session returns the handle's session, issuing one when it has none or
// when the one it has expires within 30 seconds.
func (w *Workspace) Session(ctx context.Context) (*Session, error) {
	d, err := w.dataPlane(ctx)
	if err != nil {
		return nil, err
	}
	return d.session, nil
}

func (w *Workspace) dataPlane(ctx context.Context) (*dataPlane, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := w.dp; d != nil && (d.session.ExpiresAt.IsZero() || time.Until(d.session.ExpiresAt) > d.renewBefore) {
		return d, nil
	}
	req := &ctrlv1.IssueSessionRequest{WorkspaceId: w.id, TtlSeconds: uint32(w.c.sessionTTL / time.Second)}
	resp, err := w.c.sessions().IssueSession(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	s := &Session{ID: resp.Msg.GetSessionId(), Token: resp.Msg.GetToken(), Endpoint: resp.Msg.GetEndpoint()}
	if t := resp.Msg.GetExpiresAt(); t != nil {
		s.ExpiresAt = t.AsTime()
	}
	w.dp = w.c.newDataPlane(s)
	return w.dp, nil
}

// maxDataPlaneMessage bounds a message read from the data plane: what a
// guest answers is not trusted, and a message without end (or a small one
// that inflates) would take the caller's memory. A screenshot may be
// larger: maxScreenshot bounds it (the PNG of 8192 × 8192 pixels that do
// not compress).
const (
	maxDataPlaneMessage = 64 << 20
	maxScreenshot       = 256 << 20
)

// newDataPlane returns the data-plane clients of s.
func (c *Client) newDataPlane(s *Session) *dataPlane {
	// Data-plane messages go uncompressed: gzip would cost both ends CPU on
	// every message, and file and port bytes are often compressed already.
	opts := append(c.clientOptions(s.Token), connect.WithAcceptCompression("gzip", nil, nil))
	screenOpts := append(slices.Clone(opts), connect.WithReadMaxBytes(maxScreenshot))
	opts = append(opts, connect.WithReadMaxBytes(maxDataPlaneMessage))
	tok, _ := sessiontoken.Parse(s.Token)
	return &dataPlane{
		session:     s,
		generation:  tok.Generation,
		renewBefore: min(renewBefore, time.Until(s.ExpiresAt)/2),
		proc:        datav1connect.NewProcessServiceClient(c.hc, s.Endpoint, opts...),
		files:       datav1connect.NewFileServiceClient(c.hc, s.Endpoint, opts...),
		metrics:     datav1connect.NewMetricsServiceClient(c.hc, s.Endpoint, opts...),
		services:    datav1connect.NewServiceServiceClient(c.hc, s.Endpoint, opts...),
		screen:      datav1connect.NewScreenServiceClient(c.hc, s.Endpoint, screenOpts...),
		input:       datav1connect.NewInputServiceClient(c.hc, s.Endpoint, opts...),
	}
}

// WorkspaceWithSession returns a handle on the Workspace id, without a call
// to the control plane, whose data-plane calls use s, a session issued
// before (by another handle, or another process that kept it): until s is
// about to expire or the data plane refuses it (expired, revoked, or of an
// earlier start of the Workspace), then a session the handle issues, as any
// handle does. A refused call, or one whose endpoint could not be
// reached at all, is made once more with the new session; one that may
// have reached it (its answer lost) is not, since it may have run. The
// handle's Info is nil. A session whose token does not name the Workspace
// id is not used: the handle issues its own, and for a Workspace that does
// not exist its calls fail with the NotFound of issuing it.
func (c *Client) WorkspaceWithSession(id string, s *Session) *Workspace {
	w := &Workspace{c: c, id: id}
	if s == nil || s.Endpoint == "" {
		return w
	}
	if tok, err := sessiontoken.Parse(s.Token); err == nil && tok.WorkspaceID == id {
		w.dp = c.newDataPlane(s)
		w.dp.given = true
	}
	return w
}

// CurrentSession returns the session the handle holds, without issuing
// one: nil before its first data-plane call, or after the data plane
// refused its session and no new one was issued.
func (w *Workspace) CurrentSession() *Session {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dp == nil {
		return nil
	}
	return w.dp.session
}

// refused reports whether a call through d failed because the data plane
// refused d's session so that a new one may succeed: it expired, or is not
// valid for the Workspace's execution (of an earlier start: a handle
// outlives a stop and start; or the data plane was rotated). A session
// revoked stays revoked for the handle that issued it: whoever revoked it
// meant it. For a session the handle was given, any refusal, or an
// endpoint that could not be reached (the Workspace has moved to another
// host since the session was issued, and a new session names that host).
// Any other unavailable call may have run there, its answer lost on the
// way, and sending it again would run it twice.
func refused(d *dataPlane, err error) bool {
	if sessionExpired(err) {
		return true
	}
	if d.given && connect.CodeOf(err) == connect.CodeUnavailable && notReached(err) {
		return true
	}
	f, ok := FailureOf(err)
	if !ok || connect.CodeOf(err) != connect.CodeUnauthenticated ||
		f.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_AUTHORIZING_DATA_PLANE {
		return false
	}
	return d.given || f.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_SESSION_REVOKED
}

// notReached reports whether err is a failure to connect to the endpoint
// at all (its dial failed, a name did not resolve), so that no request
// reached it.
func notReached(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// dropRefused reports whether err is the data plane refusing d's session
// so that a new one may succeed (refused), and then forgets d: the
// Workspace's next call issues a new session, whether or not the failed
// call can be sent again (an upload whose bytes cannot be read again).
func (w *Workspace) dropRefused(d *dataPlane, err error) bool {
	if !refused(d, err) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dp == d { // unless another call already replaced it
		w.dp = nil
	}
	return true
}

// dataPlaneIn returns the data plane of the Workspace's run gen (its
// generation; 0 for whichever runs now). Once a later run's session
// replaced gen's, the call is not found: what it names (a process by pid)
// ended with gen, and the same name in the later run is another's.
func (w *Workspace) dataPlaneIn(ctx context.Context, gen uint64) (*dataPlane, error) {
	d, err := w.dataPlane(ctx)
	if err == nil && gen != 0 && d.generation != 0 && d.generation != gen {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf(
			"it ran in an earlier start of workspace %s (generation %d; generation %d runs now) and ended with it", w.id, gen, d.generation))
	}
	return d, err
}

// unary calls a unary data-plane method, with a new session once more when
// the data plane reports the session expired. method picks the method of a
// dataPlane's client.
func unary[Req, Resp any](ctx context.Context, w *Workspace, method func(*dataPlane) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*Resp, error) {
	return unaryIn(ctx, w, 0, method, req)
}

// unaryIn is unary in the Workspace's run gen (see dataPlaneIn).
func unaryIn[Req, Resp any](ctx context.Context, w *Workspace, gen uint64, method func(*dataPlane) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*Resp, error) {
	for retried := false; ; retried = true {
		d, err := w.dataPlaneIn(ctx, gen)
		if err != nil {
			return nil, err
		}
		resp, err := method(d)(ctx, connect.NewRequest(req))
		if err == nil {
			return resp.Msg, nil
		}
		if !w.dropRefused(d, err) || retried {
			return nil, err
		}
	}
}

// serverStream opens a server stream and receives its first message, with
// a new session once more when that fails because the session expired.
// ok reports whether stream.Msg holds the first message; when it does not,
// the stream ended without one and without an error.
func serverStream[Req, Msg any](ctx context.Context, w *Workspace, method func(*dataPlane) func(context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Msg], error), req *Req) (stream *connect.ServerStreamForClient[Msg], ok bool, err error) {
	stream, ok, _, err = serverStreamIn(ctx, w, 0, method, req)
	return stream, ok, err
}

// serverStreamIn is serverStream in the Workspace's run gen (see
// dataPlaneIn); it also returns the run the stream reached.
func serverStreamIn[Req, Msg any](ctx context.Context, w *Workspace, gen uint64, method func(*dataPlane) func(context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Msg], error), req *Req) (stream *connect.ServerStreamForClient[Msg], ok bool, reached uint64, err error) {
	for retried := false; ; retried = true {
		d, err := w.dataPlaneIn(ctx, gen)
		if err != nil {
			return nil, false, 0, err
		}
		stream, err := method(d)(ctx, connect.NewRequest(req))
		if err == nil {
			if stream.Receive() {
				return stream, true, d.generation, nil
			}
			if err = stream.Err(); err == nil {
				return stream, false, d.generation, nil
			}
			stream.Close()
		}
		if !w.dropRefused(d, err) || retried {
			return nil, false, 0, err
		}
	}
}
