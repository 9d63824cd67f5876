package agent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/host/runtime/fake"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// These tests run the reconciler against the fake driver and hostAPI, a
// stand-in for ctrl's host API: a test sets the desired set as ctrl would
// and reads back exactly the reports the agent sent, which ctrl's fold
// into workspace states would hide. Network slots are real (a netns and a
// TUN device each), so the tests need root.

// waitBound is how long a test waits for the agent to get somewhere
// before it is reported as stuck (a bound, not a measure).
const waitBound = 30 * time.Second

// hostAPI is ctrl's host API in memory.
type hostAPI struct {
	hostv1connect.UnimplementedHostServiceHandler

	mu          sync.Mutex
	assignments map[string]*hostv1.Assignment
	reports     []*hostv1.ExecutionReport
	blobs       map[string][]byte
	failBlobs   bool
	// refuse makes RegisterHost refuse the host's credentials.
	refuse bool
	// lease is the host lease RegisterHost names (and a report interval
	// of a third of it); zero names none.
	lease time.Duration
	// silent makes RegisterHost and ReportExecutions fail unavailable, and
	// WatchAssignments send nothing more: ctrl cut off from the host.
	silent bool
	// replaced makes RegisterHost and WatchAssignments fail
	// failed_precondition: another agent took the host's name.
	replaced bool
	// registrations and reportCalls count the calls of RegisterHost
	// and ReportExecutions.
	registrations, reportCalls int
	// dead are the layers CollectableLayers names when asked; asked are
	// the layers it was asked about.
	dead, asked map[string]bool
	// held, while open, keeps WatchAssignments from sending anything.
	held chan struct{}
	// changed is closed and replaced on every change of the above.
	changed chan struct{}
}

func newHostAPI() *hostAPI {
	return &hostAPI{assignments: map[string]*hostv1.Assignment{}, blobs: map[string][]byte{}, changed: make(chan struct{}),
		dead: map[string]bool{}, asked: map[string]bool{}}
}

// notify wakes the waiters; mu is held.
func (h *hostAPI) notify() {
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *hostAPI) RegisterHost(context.Context, *connect.Request[hostv1.RegisterHostRequest]) (*connect.Response[hostv1.RegisterHostResponse], error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.registrations++
	h.notify()
	if h.refuse {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("a valid host token is required"))
	}
	if h.silent {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the control plane cannot be reached"))
	}
	if h.replaced {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("host is served by another agent now"))
	}
	resp := &hostv1.RegisterHostResponse{}
	if h.lease > 0 {
		resp.HostLease, resp.ReportInterval = durationpb.New(h.lease), durationpb.New(h.lease/3)
	}
	return connect.NewResponse(resp), nil
}

func (h *hostAPI) WatchAssignments(ctx context.Context, _ *connect.Request[hostv1.WatchAssignmentsRequest], stream *connect.ServerStream[hostv1.WatchAssignmentsResponse]) error {
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	if held != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-held:
		}
	}
	for {
		h.mu.Lock()
		msg := &hostv1.WatchAssignmentsResponse{}
		for _, as := range h.assignments {
			msg.Assignments = append(msg.Assignments, proto.CloneOf(as))
		}
		changed, silent, replaced := h.changed, h.silent, h.replaced
		h.mu.Unlock()
		if replaced {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("host is served by another agent now"))
		}
		if silent {
			msg = nil
		}
		if err := stream.Send(msg); msg != nil && err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

func (h *hostAPI) ReportExecutions(_ context.Context, req *connect.Request[hostv1.ReportExecutionsRequest]) (*connect.Response[hostv1.ReportExecutionsResponse], error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reportCalls++
	if h.silent {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the control plane cannot be reached"))
	}
	h.reports = append(h.reports, req.Msg.Reports...)
	h.notify()
	return connect.NewResponse(&hostv1.ReportExecutionsResponse{}), nil
}

func (h *hostAPI) GetTemplateBlob(_ context.Context, req *connect.Request[hostv1.GetTemplateBlobRequest], stream *connect.ServerStream[hostv1.GetTemplateBlobResponse]) error {
	h.mu.Lock()
	b, ok := h.blobs[req.Msg.Digest]
	fail := h.failBlobs
	h.mu.Unlock()
	if fail {
		return connect.NewError(connect.CodeUnavailable, errors.New("the blob store does not answer"))
	}
	if !ok {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("no blob %s", req.Msg.Digest))
	}
	return stream.Send(&hostv1.GetTemplateBlobResponse{Data: b})
}

func (h *hostAPI) CollectableLayers(_ context.Context, req *connect.Request[hostv1.CollectableLayersRequest]) (*connect.Response[hostv1.CollectableLayersResponse], error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(req.Msg.LayerIds) > maxLayersAsked {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%d layer IDs in one call", len(req.Msg.LayerIds)))
	}
	resp := &hostv1.CollectableLayersResponse{}
	for _, id := range req.Msg.LayerIds {
		h.asked[id] = true
		if h.dead[id] {
			resp.LayerIds = append(resp.LayerIds, id)
		}
	}
	return connect.NewResponse(resp), nil
}

// assign replaces the assignment of its execution (nil as removes the
// execution id) and returns the number of reports so far, from which
// await looks for what follows.
func (h *hostAPI) assign(id string, as *hostv1.Assignment) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if as == nil {
		delete(h.assignments, id)
	} else {
		h.assignments[id] = proto.CloneOf(as)
	}
	h.notify()
	return len(h.reports)
}

// mark returns the number of reports so far.
func (h *hostAPI) mark() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.reports)
}

// await returns the first report of execution id in state made after the
// first from reports.
func (h *hostAPI) await(t *testing.T, from int, id string, state hostv1.ObservedState) *hostv1.ExecutionReport {
	t.Helper()
	return h.awaitReport(t, from, id, state.String(), func(r *hostv1.ExecutionReport) bool { return r.State == state })
}

// awaitReport returns the first report of id, from the from-th on, that
// match accepts; what names it in the failure.
func (h *hostAPI) awaitReport(t *testing.T, from int, id, what string, match func(*hostv1.ExecutionReport) bool) *hostv1.ExecutionReport {
	t.Helper()
	deadline := time.After(waitBound)
	for {
		h.mu.Lock()
		for _, r := range h.reports[from:] {
			if r.ExecutionId == id && match(r) {
				h.mu.Unlock()
				return r
			}
		}
		changed := h.changed
		h.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %s report of %s within %s; reports: %v", what, id, waitBound, h.states(id))
		}
	}
}

// states returns the states execution id was reported in, in order,
// without repeats.
func (h *hostAPI) states(id string) []hostv1.ObservedState {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []hostv1.ObservedState
	for _, r := range h.reports {
		if r.ExecutionId == id && (len(out) == 0 || out[len(out)-1] != r.State) {
			out = append(out, r.State)
		}
	}
	return out
}

// eventually waits until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, waitBound)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reconcilerEnv is one test's host: the fake driver, the host API, and the
// directories an agent works in; agents come and go over it.
type reconcilerEnv struct {
	api      *hostAPI
	driver   *fake.Driver
	cfg      Config
	template *hostv1.ExecutionTemplate
	// probeTimeout, when set, is the agents' bound on one guest probe.
	probeTimeout time.Duration
	// stopGrace, when set, is the agents' grace of a NORMAL stop.
	stopGrace time.Duration
}

func newReconcilerEnv(t *testing.T) *reconcilerEnv {
	t.Helper()
	hosttest.RequireRoot(t) // network slots are network namespaces
	api := newHostAPI()
	mux := http.NewServeMux()
	mux.Handle(hostv1connect.NewHostServiceHandler(api))
	srv := testutil.H2CServer(t, mux)
	dir := t.TempDir()
	images, err := imagestore.Open(filepath.Join(dir, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	driver := fake.New()
	e := &reconcilerEnv{api: api, driver: driver, cfg: Config{
		HostID: "host_test", Client: hostv1connect.NewHostServiceClient(h2c(), srv.URL),
		Driver: driver, Layers: driver, Template: images, LayerDir: filepath.Join(dir, "layers"),
		GuestAgent: "/bin/kibotos-guest", Network: NetworkConfig{Dir: filepath.Join(dir, "netns")},
	}}
	if err := os.MkdirAll(e.cfg.Network.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	e.template = e.addTemplate(t)
	// Registered before the agents' cleanups, so it runs after them:
	// release what they left as a host's next agent would.
	t.Cleanup(func() {
		for _, id := range driver.IDs() {
			driver.Stop(context.Background(), id, runtime.StopForce, 0)
		}
		ents, _ := os.ReadDir(e.cfg.Network.Dir)
		for _, ent := range ents {
			if err := netslot.Release(filepath.Join(e.cfg.Network.Dir, ent.Name())); err != nil {
				t.Errorf("releasing the namespace %s: %v", ent.Name(), err)
			}
		}
	})
	return e
}

// addTemplate gives the host API a one-layer template.
func (e *reconcilerEnv) addTemplate(t *testing.T) *hostv1.ExecutionTemplate {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	motd := []byte("fake\n")
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(motd))})
	tw.Write(motd)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	digest := fmt.Sprintf("sha256:%x", sha256.Sum256(gz.Bytes()))
	e.api.mu.Lock()
	e.api.blobs[digest] = gz.Bytes()
	e.api.mu.Unlock()
	return &hostv1.ExecutionTemplate{TemplateId: "tpl_test", Revision: "1", ImageDigest: fmt.Sprintf("sha256:%064x", 1),
		Layers: []*hostv1.TemplateLayer{{Digest: digest, DiffId: fmt.Sprintf("sha256:%x", sha256.Sum256(raw.Bytes())), SizeBytes: uint64(gz.Len())}}}
}

// runAgent runs an agent over driver until the test ends or the returned
// function is called, which ends it as the end of its process would:
// executions and their namespaces stay, the agent's hold on them goes.
func (e *reconcilerEnv) runAgent(t *testing.T, driver *fake.Driver) (a *Agent, end func()) {
	t.Helper()
	cfg := e.cfg
	cfg.Driver = driver
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.readyTimeout = 200 * time.Millisecond
	a.probeEvery = 20 * time.Millisecond
	if e.probeTimeout != 0 {
		a.probeTimeout = e.probeTimeout
	}
	if e.stopGrace != 0 {
		a.stopGrace = e.stopGrace
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx)
	}()
	var once sync.Once
	end = func() {
		once.Do(func() {
			cancel()
			<-done
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, ex := range a.execs {
				if s := ex.getSlot(); s != nil {
					s.Close()
				}
			}
		})
	}
	t.Cleanup(end)
	return a, end
}

// assignment is execution gen of workspace ws on layer lay, desired
// RUNNING.
func (e *reconcilerEnv) assignment(ws string, gen uint64, lay string) *hostv1.Assignment {
	return &hostv1.Assignment{ExecutionId: fmt.Sprintf("%s-%d", ws, gen), WorkspaceId: ws, Generation: gen,
		Desired: hostv1.DesiredState_DESIRED_STATE_RUNNING, Template: e.template, LayerId: lay,
		Resources: &ctrlv1.ResourceRequest{CpuMillis: 1000, MemoryBytes: 256 << 20, WritableLayerBytes: 64 << 20},
		Network:   &hostv1.NetworkAssignment{Policy: &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, Revision: 1}}}
}

// stopped returns as desired STOPPED in mode.
func stopped(as *hostv1.Assignment, mode ctrlv1.StopMode, command string) *hostv1.Assignment {
	as = proto.CloneOf(as)
	as.Desired, as.Stop = hostv1.DesiredState_DESIRED_STATE_STOPPED, &hostv1.StopRequest{Mode: mode, CommandId: command}
	return as
}

// running assigns as and waits until it is reported RUNNING.
func (e *reconcilerEnv) running(t *testing.T, as *hostv1.Assignment) *hostv1.ExecutionReport {
	t.Helper()
	return e.api.await(t, e.api.assign(as.ExecutionId, as), as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
}

// released checks that nothing of execution id is left: the driver holds
// nothing of it, its namespace is gone.
func (e *reconcilerEnv) released(t *testing.T, id string) {
	t.Helper()
	if slices.Contains(e.driver.IDs(), id) {
		t.Errorf("the driver still holds %s", id)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.Network.Dir, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the namespace of %s is left: %v", id, err)
	}
}

// TestReconcilerStartStopNormal: an assignment is delivered, started and
// reported RUNNING with what the driver was given; a raised memory reaches
// the running execution; a NORMAL stop is reported STOPPED with
// durability CONFIRMED and the stop's command; the next execution of the
// workspace continues its layer; an execution ctrl no longer assigns is
// stopped and forgotten.
func TestReconcilerStartStopNormal(t *testing.T) {
	e := newReconcilerEnv(t)
	e.runAgent(t, e.driver)
	as := e.assignment("ws_a", 1, "lay_a")
	// The guest agent boots with no CPU quota; the workspace's applies
	// once it answers.
	e.driver.NeverReady(as.ExecutionId)
	mark := e.api.assign(as.ExecutionId, as)
	eventually(t, "the execution boots", func() bool { return e.driver.Starts(as.ExecutionId) == 1 })
	if spec, _, _ := e.driver.Spec(as.ExecutionId); spec.CPUMillis != 0 {
		t.Errorf("the guest boots with a CPU quota of %d millicores", spec.CPUMillis)
	}
	e.driver.Answer(as.ExecutionId)
	r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	if got := e.api.states(as.ExecutionId); !slices.Equal(got, []hostv1.ObservedState{hostv1.ObservedState_OBSERVED_STATE_DELIVERING,
		hostv1.ObservedState_OBSERVED_STATE_STARTING, hostv1.ObservedState_OBSERVED_STATE_RUNNING}) {
		t.Errorf("reported %v", got)
	}
	if r.LayerContinued || r.GetLayerCapacityBytes() != 64<<20 || r.WorkspaceId != "ws_a" || r.Generation != 1 ||
		r.GetNetwork().GetStatus().GetAppliedRevision() != 1 {
		t.Errorf("RUNNING report: %v", r)
	}
	spec, memory, ok := e.driver.Spec(as.ExecutionId)
	if !ok {
		t.Fatal("the driver does not run the execution")
	}
	if spec.LayerImage != filepath.Join(e.cfg.LayerDir, "lay_a.ext4") || spec.NetNS != filepath.Join(e.cfg.Network.Dir, as.ExecutionId) ||
		len(spec.Layers) != 1 || spec.Hostname != "ws_a" || spec.CPUMillis != 1000 || memory != 256<<20 || spec.GuestAgent != e.cfg.GuestAgent {
		t.Errorf("started with %+v, memory %d", spec, memory)
	}
	if b, err := os.ReadFile(filepath.Join(spec.Layers[0], "etc", "motd")); err != nil || string(b) != "fake\n" {
		t.Errorf("the delivered layer: %q, %v", b, err)
	}

	raised := proto.CloneOf(as)
	raised.Resources.MemoryBytes = 512 << 20
	e.api.assign(as.ExecutionId, raised)
	eventually(t, "the raised memory reaches the execution", func() bool {
		_, memory, _ := e.driver.Spec(as.ExecutionId)
		return memory == 512<<20
	})

	mark = e.api.assign(as.ExecutionId, stopped(raised, ctrlv1.StopMode_STOP_MODE_NORMAL, "cmd_stop"))
	r = e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
	if r.StopDurability != ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED || r.StopCommandId != "cmd_stop" || r.GetLayerCapacityBytes() != 64<<20 {
		t.Errorf("STOPPED report: %v", r)
	}
	e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPING)
	e.released(t, as.ExecutionId)

	e.api.assign(as.ExecutionId, nil)
	next := e.assignment("ws_a", 2, "lay_a")
	if r := e.running(t, next); !r.LayerContinued {
		t.Errorf("the next execution did not continue the layer: %v", r)
	}
	e.api.assign(next.ExecutionId, nil)
	eventually(t, "an unassigned execution is stopped and its namespace released", func() bool {
		_, err := os.Stat(filepath.Join(e.cfg.Network.Dir, next.ExecutionId))
		return len(e.driver.IDs()) == 0 && errors.Is(err, os.ErrNotExist)
	})
	if _, err := os.Stat(spec.LayerImage); err != nil {
		t.Errorf("the layer image went with an unassigned execution: %v", err)
	}
}

// TestReconcilerStopModes: a FORCE stop, and a NORMAL stop the driver
// could not confirm, are reported UNCONFIRMED; a stop that fails is
// FAILED at stage STOPPING.
func TestReconcilerStopModes(t *testing.T) {
	e := newReconcilerEnv(t)
	e.runAgent(t, e.driver)
	for _, c := range []struct {
		ws      string
		mode    ctrlv1.StopMode
		outcome *runtime.StopResult
	}{
		{"ws_force", ctrlv1.StopMode_STOP_MODE_FORCE, nil},
		{"ws_unsynced", ctrlv1.StopMode_STOP_MODE_NORMAL, &runtime.StopResult{Confirmed: false}},
	} {
		as := e.assignment(c.ws, 1, "lay_"+c.ws)
		e.running(t, as)
		if c.outcome != nil {
			e.driver.SetStopOutcome(as.ExecutionId, *c.outcome, nil)
		}
		mark := e.api.assign(as.ExecutionId, stopped(as, c.mode, "cmd_"+c.ws))
		r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
		if r.StopDurability != ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED || r.StopCommandId != "cmd_"+c.ws {
			t.Errorf("%s: STOPPED report %v", c.ws, r)
		}
		e.released(t, as.ExecutionId)
	}

	as := e.assignment("ws_stuck", 1, "lay_stuck")
	e.running(t, as)
	e.driver.SetStopOutcome(as.ExecutionId, runtime.StopResult{}, errors.New("the layer would not unmount"))
	mark := e.api.assign(as.ExecutionId, stopped(as, ctrlv1.StopMode_STOP_MODE_NORMAL, "cmd_stuck"))
	r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_FAILED)
	if r.FailureStage != ctrlv1.FailureStage_FAILURE_STAGE_STOPPING || r.FailureReason != ctrlv1.FailureReason_FAILURE_REASON_INTERNAL {
		t.Errorf("failed stop: %v", r)
	}
	// The agent tries again (the outcome was for one stop) and gets there.
	r = e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
	if r.StopDurability != ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED {
		t.Errorf("the stop after the failed one: %v", r)
	}
	e.released(t, as.ExecutionId)
}

// TestReconcilerStopEscalated: a FORCE stop or a delete assigned while a
// NORMAL stop waits out its grace (the guest ignores it) ends the
// execution at once, not when the grace ends: STOPPED, UNCONFIRMED, under
// the FORCE stop's command; or DELETED.
func TestReconcilerStopEscalated(t *testing.T) {
	e := newReconcilerEnv(t)
	e.stopGrace = time.Hour
	e.runAgent(t, e.driver)
	for _, then := range []string{"force", "delete"} {
		ws := "ws_" + then
		as := e.assignment(ws, 1, "lay_"+ws)
		e.running(t, as)
		e.driver.IgnoreTerm(as.ExecutionId)
		normal := stopped(as, ctrlv1.StopMode_STOP_MODE_NORMAL, "cmd_normal")
		e.api.await(t, e.api.assign(as.ExecutionId, normal), as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPING)
		if then == "force" {
			mark := e.api.assign(as.ExecutionId, stopped(as, ctrlv1.StopMode_STOP_MODE_FORCE, "cmd_force"))
			r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
			if r.StopDurability != ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED || r.StopCommandId != "cmd_force" {
				t.Errorf("a NORMAL stop escalated by a FORCE one: %v", r)
			}
		} else {
			deleted := proto.CloneOf(normal)
			deleted.Desired = hostv1.DesiredState_DESIRED_STATE_DELETED
			e.api.await(t, e.api.assign(as.ExecutionId, deleted), as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_DELETED)
		}
		e.released(t, as.ExecutionId)
	}
}

// TestReconcilerFailedStart: a start that fails is reported FAILED at the
// stage it failed at, releases what the attempt set up, and is not
// retried by the driver.
func TestReconcilerFailedStart(t *testing.T) {
	e := newReconcilerEnv(t)
	e.runAgent(t, e.driver)
	for _, c := range []struct {
		ws     string
		inject func(id string)
		stage  ctrlv1.FailureStage
		reason ctrlv1.FailureReason
	}{
		{"ws_start", func(id string) { e.driver.FailStart(id, errors.New("runtime refused")) },
			ctrlv1.FailureStage_FAILURE_STAGE_STARTING, ctrlv1.FailureReason_FAILURE_REASON_INTERNAL},
		{"ws_ready", e.driver.NeverReady,
			ctrlv1.FailureStage_FAILURE_STAGE_WAITING_FOR_READINESS, ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT},
		{"ws_deliver", func(string) { e.api.mu.Lock(); e.api.failBlobs = true; e.api.mu.Unlock() },
			ctrlv1.FailureStage_FAILURE_STAGE_CREATING, ctrlv1.FailureReason_FAILURE_REASON_INTERNAL},
		// The host's disk cannot hold the layer: nothing boots.
		{"ws_disk", func(string) {
			e.driver.FailReserve(filepath.Join(e.cfg.LayerDir, "lay_ws_disk.ext4"), fmt.Errorf("the host's disk has 3 MiB free: %w", syscall.ENOSPC))
		}, ctrlv1.FailureStage_FAILURE_STAGE_STARTING, ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED},
	} {
		as := e.assignment(c.ws, 1, "lay_"+c.ws)
		if c.ws == "ws_deliver" {
			// A layer the host does not have yet.
			as.Template = proto.CloneOf(as.Template)
			as.Template.Layers[0].Digest = fmt.Sprintf("sha256:%064x", 3)
			as.Template.Layers[0].DiffId = fmt.Sprintf("sha256:%064x", 2)
		}
		c.inject(as.ExecutionId)
		r := e.api.await(t, e.api.assign(as.ExecutionId, as), as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_FAILED)
		if r.FailureStage != c.stage || r.FailureReason != c.reason || r.FailureMessage == "" {
			t.Errorf("%s: FAILED report %v; want stage %v, reason %v", c.ws, r, c.stage, c.reason)
		}
		e.released(t, as.ExecutionId)
	}
	if n := e.driver.Starts("ws_ready-1"); n != 1 {
		t.Errorf("the execution that never became ready started %d times", n)
	}
	if n := e.driver.Starts("ws_disk-1"); n != 0 {
		t.Errorf("the execution whose layer the disk cannot hold started %d times", n)
	}
}

// TestReconcilerExit: an execution whose init ends on its own is reported
// EXITED, with the OOM kill when the OOM killer ended it, and released. A
// guest that shuts itself down after the OOM killer ended one of its
// processes (before it answered a probe again) ended by its poweroff.
func TestReconcilerExit(t *testing.T) {
	e := newReconcilerEnv(t)
	e.runAgent(t, e.driver)
	for ws, c := range map[string]struct {
		status runtime.Status
		oom    bool
	}{
		"ws_oom": {runtime.Status{ExitCode: 137, Signal: "KILL", OOMKilled: true, OOMKills: 1}, true},
		"ws_off": {runtime.Status{Shutdown: true, OOMKills: 1}, false},
	} {
		as := e.assignment(ws, 1, "lay_"+ws)
		e.running(t, as)
		mark := e.api.mark()
		if !e.driver.Exit(as.ExecutionId, c.status) {
			t.Fatal("the execution does not run")
		}
		if r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_EXITED); r.OomKilled != c.oom {
			t.Errorf("%s: EXITED report %v, want oom_killed %v", ws, r, c.oom)
		}
		e.released(t, as.ExecutionId)
	}
}

// TestReconcilerDelete: deleting a running execution (no stop request:
// FORCE) and a stopped one reports DELETED and removes the layer image.
func TestReconcilerDelete(t *testing.T) {
	e := newReconcilerEnv(t)
	e.runAgent(t, e.driver)
	for _, stopFirst := range []bool{false, true} {
		ws := fmt.Sprintf("ws_del%v", stopFirst)
		as := e.assignment(ws, 1, "lay_"+ws)
		e.running(t, as)
		if stopFirst {
			mark := e.api.assign(as.ExecutionId, stopped(as, ctrlv1.StopMode_STOP_MODE_NORMAL, ""))
			e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
		}
		deleted := proto.CloneOf(as)
		deleted.Desired = hostv1.DesiredState_DESIRED_STATE_DELETED
		e.api.await(t, e.api.assign(as.ExecutionId, deleted), as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_DELETED)
		e.released(t, as.ExecutionId)
		if _, err := os.Stat(filepath.Join(e.cfg.LayerDir, "lay_"+ws+".ext4")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the layer image is left: %v", ws, err)
		}
	}
}

// TestReconcilerCollectsDeadLayers: the writable layer images no
// assignment names are asked about, and those ctrl names dead are deleted;
// the others stay, a temporary image is never asked about, nor is the
// layer of an execution assigned here, even one ctrl would call dead. An
// execution ctrl no longer assigns is stopped and then its layer is asked
// about at once. More layers than one call asks about are asked about in
// several.
func TestReconcilerCollectsDeadLayers(t *testing.T) {
	e := newReconcilerEnv(t)
	if err := os.MkdirAll(e.cfg.LayerDir, 0o700); err != nil {
		t.Fatal(err)
	}
	image := func(name string) string { return filepath.Join(e.cfg.LayerDir, name) }
	names := []string{"ws_gone.ext4", "ws_kept.ext4", ".ws_tmp.ext4.tmp-1"}
	for i := range maxLayersAsked { // listed before ws_gone
		names = append(names, fmt.Sprintf("ws_a%04d.ext4", i))
	}
	for _, name := range names {
		if err := fake.Image(image(name), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	e.api.mu.Lock()
	for _, id := range []string{"ws_gone", "lay_live", "lay_stale", ".ws_tmp"} {
		e.api.dead[id] = true
	}
	e.api.mu.Unlock()
	e.runAgent(t, e.driver)
	live, stale := e.assignment("ws_live", 1, "lay_live"), e.assignment("ws_stale", 1, "lay_stale")
	e.running(t, live)
	e.running(t, stale)
	exists := func(name string) bool {
		_, err := os.Stat(image(name))
		return err == nil
	}
	eventually(t, "the dead layer deleted", func() bool { return !exists("ws_gone.ext4") })

	// ctrl no longer assigns stale (its workspace deleted while the host
	// was LOST, say).
	e.api.assign(stale.ExecutionId, nil)
	eventually(t, "the layer of the execution no longer assigned deleted", func() bool { return !exists("lay_stale.ext4") })
	e.released(t, stale.ExecutionId)
	for _, name := range []string{"ws_kept.ext4", "lay_live.ext4", ".ws_tmp.ext4.tmp-1"} {
		if !exists(name) {
			t.Errorf("%s was deleted", name)
		}
	}
	e.api.mu.Lock()
	defer e.api.mu.Unlock()
	if !e.api.asked["ws_kept"] || e.api.asked["lay_live"] || e.api.asked[".ws_tmp"] || e.api.asked[".ws_tmp.ext4.tmp-1"] {
		t.Errorf("the host asked about %v; want ws_kept among them, never lay_live nor the temporary image", e.api.asked)
	}
}

// TestRecoveryKeepsTheNamespacesOfRunningGuests: a recovery that stops
// midway (the agent told to stop as it starts) or cannot settle an
// execution (its runtime state unreadable) releases no namespace of an
// execution that may run: a running guest's network lives in it. What the
// driver says ended is released.
func TestRecoveryKeepsTheNamespacesOfRunningGuests(t *testing.T) {
	e := newReconcilerEnv(t)
	_, end := e.runAgent(t, e.driver)
	unsettled, dead := e.assignment("ws_unsettled", 1, "lay_unsettled"), e.assignment("ws_dead", 1, "lay_dead")
	e.running(t, unsettled)
	e.running(t, dead)
	end()
	e.driver.Exit(dead.ExecutionId, runtime.Status{ExitCode: 0})
	namespace := func(id string) bool {
		_, err := os.Stat(filepath.Join(e.cfg.Network.Dir, id))
		return err == nil
	}
	recoverWith := func(ctx context.Context, driver *fake.Driver) {
		cfg := e.cfg
		cfg.Driver = driver
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		a.recoverExecutions(ctx)
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, ex := range a.execs {
			ex.cancel()
			if s := ex.getSlot(); s != nil {
				s.Close()
			}
		}
	}

	stopping, cancel := context.WithCancel(context.Background())
	cancel()
	recoverWith(stopping, e.driver.Restart())
	if !namespace(unsettled.ExecutionId) || !namespace(dead.ExecutionId) {
		t.Fatalf("a recovery cut short released namespaces: %s %v, %s %v", unsettled.ExecutionId, namespace(unsettled.ExecutionId),
			dead.ExecutionId, namespace(dead.ExecutionId))
	}

	restarted := e.driver.Restart()
	restarted.FailRecover(unsettled.ExecutionId, errors.New("runc state: signal: killed"))
	recoverWith(context.Background(), restarted)
	if !namespace(unsettled.ExecutionId) {
		t.Error("the namespace of an execution the recovery could not settle was released")
	}
	if namespace(dead.ExecutionId) {
		t.Error("the namespace of an execution that ended is left")
	}
}

// TestReconcilerRestart: a new agent (over a new driver object, as after a
// restart of the host agent's process) adopts the execution that still
// runs without starting it again, serves its namespace again, and reports
// it RUNNING, its layer held in full (an older build left it sparse); the
// leftovers of one that ended while no agent ran are released.
func TestReconcilerRestart(t *testing.T) {
	e := newReconcilerEnv(t)
	_, end := e.runAgent(t, e.driver)
	alive, dead := e.assignment("ws_alive", 1, "lay_alive"), e.assignment("ws_dead", 1, "lay_dead")
	e.running(t, alive)
	e.running(t, dead)
	end()
	e.driver.ForgetReservations()

	// While no agent runs, one ends and ctrl lets go of it.
	e.driver.Exit(dead.ExecutionId, runtime.Status{ExitCode: 0})
	mark := e.api.assign(dead.ExecutionId, nil)

	a2, _ := e.runAgent(t, e.driver.Restart())
	r := e.api.await(t, mark, alive.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	if !r.LayerContinued || r.GetLayerCapacityBytes() != 64<<20 {
		t.Errorf("RUNNING report after the restart: %v", r)
	}
	if n := e.driver.Starts(alive.ExecutionId); n != 1 {
		t.Errorf("the running execution was started %d times", n)
	}
	if !e.driver.Reserved(filepath.Join(e.cfg.LayerDir, "lay_alive.ext4")) {
		t.Error("the layer of the adopted execution is not reserved")
	}
	a2.mu.Lock()
	adopted := a2.execs[alive.ExecutionId]
	a2.mu.Unlock()
	if adopted == nil || adopted.getSlot() == nil {
		t.Error("the adopted execution's network slot is not served")
	}
	// Recovery happens before the agent serves: nothing to wait for.
	e.released(t, dead.ExecutionId)

	// The adopted execution stops like any other.
	mark = e.api.assign(alive.ExecutionId, stopped(alive, ctrlv1.StopMode_STOP_MODE_NORMAL, "cmd_after"))
	if r := e.api.await(t, mark, alive.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPED); r.StopDurability != ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED {
		t.Errorf("STOPPED report of the adopted execution: %v", r)
	}
	e.released(t, alive.ExecutionId)
}

// TestReconcilerAdoptedExit: an execution adopted after a restart that
// ends before ctrl's first assignment reaches the new agent is reported
// EXITED once it does.
func TestReconcilerAdoptedExit(t *testing.T) {
	e := newReconcilerEnv(t)
	_, end := e.runAgent(t, e.driver)
	as := e.assignment("ws_short", 1, "lay_short")
	e.running(t, as)
	end()

	held := make(chan struct{})
	e.api.mu.Lock()
	e.api.held = held
	e.api.mu.Unlock()
	mark := e.api.mark()
	a2, _ := e.runAgent(t, e.driver.Restart())
	eventually(t, "the new agent adopts the execution", func() bool {
		a2.mu.Lock()
		defer a2.mu.Unlock()
		return a2.execs[as.ExecutionId] != nil
	})
	e.driver.Exit(as.ExecutionId, runtime.Status{ExitCode: 137, Signal: "KILL", OOMKilled: true, OOMKills: 1})
	close(held)
	if r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_EXITED); !r.OomKilled || r.Generation != 1 {
		t.Errorf("EXITED report: %v", r)
	}
	e.released(t, as.ExecutionId)
}

// TestReconcilerShutdownWhileAway: a guest that shut its machine down
// while no agent ran is reported EXITED once an agent runs again, as if
// it had watched, and is not started again though ctrl still wants it
// running.
func TestReconcilerShutdownWhileAway(t *testing.T) {
	e := newReconcilerEnv(t)
	_, end := e.runAgent(t, e.driver)
	as := e.assignment("ws_off", 1, "lay_off")
	e.running(t, as)
	end()

	e.driver.Exit(as.ExecutionId, runtime.Status{ExitCode: -1, Shutdown: true})
	mark := e.api.mark()
	e.runAgent(t, e.driver.Restart())
	e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_EXITED)
	e.released(t, as.ExecutionId)
	if n := e.driver.Starts(as.ExecutionId); n != 1 {
		t.Errorf("the execution whose guest shut down was started %d times", n)
	}
}

// TestReconcilerLaunch: the host runs an execution bound to a launch it
// offers, and fails one bound to another launch as
// CAPABILITY_UNAVAILABLE without starting it.
func TestReconcilerLaunch(t *testing.T) {
	e := newReconcilerEnv(t)
	offered := &hostv1.Launch{Platform: "oci-fake/amd64", RuntimeVersion: "fake 1", GuestBuild: fmt.Sprintf("sha256:%064x", 1),
		SeccompProfile: fmt.Sprintf("sha256:%064x", 2)}
	e.cfg.Launches = []*hostv1.Launch{offered}
	e.runAgent(t, e.driver)
	as := e.assignment("ws_offered", 1, "lay_offered")
	as.Launch = proto.CloneOf(offered)
	e.running(t, as)

	other := proto.CloneOf(offered)
	other.GuestBuild = fmt.Sprintf("sha256:%064x", 3)
	as = e.assignment("ws_other", 1, "lay_other")
	as.Launch = other
	r := e.api.await(t, e.api.assign(as.ExecutionId, as), as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_FAILED)
	if r.FailureReason != ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE ||
		r.FailureStage != ctrlv1.FailureStage_FAILURE_STAGE_STARTING || !strings.Contains(r.FailureMessage, "launch") {
		t.Errorf("FAILED report %v; want CAPABILITY_UNAVAILABLE at STARTING naming the launch", r)
	}
	if n := e.driver.Starts(as.ExecutionId); n != 0 {
		t.Errorf("an execution bound to a launch the host does not offer started %d times", n)
	}
	e.released(t, as.ExecutionId)
}

// TestFencedWithoutTheControlPlane: an agent that cannot reach the
// control plane for its lease takes itself out of service (ctrl may hold
// the host LOST and run its workspaces elsewhere), and serves again only
// once a new registration is taken and its assignments applied, not with
// a report over the stream it had.
func TestFencedWithoutTheControlPlane(t *testing.T) {
	e := newReconcilerEnv(t)
	const lease = 1500 * time.Millisecond
	e.api.mu.Lock()
	e.api.lease = lease
	e.api.mu.Unlock()
	a, _ := e.runAgent(t, e.driver)
	eventually(t, "the registered agent serves", func() bool { return a.outOfService() == "" })
	as := e.assignment("ws_fenced", 1, "lay_fenced")
	e.running(t, as)
	silence := func(silent bool) int {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		e.api.silent = silent
		e.api.notify()
		return e.api.registrations
	}
	cut := time.Now()
	registrations := silence(true)
	eventually(t, "the agent fences itself", func() bool { return strings.Contains(a.outOfService(), "within its lease") })
	if d := time.Since(cut); d > lease {
		t.Errorf("fenced %v after the control plane went silent, past the lease %v", d, lease)
	}
	eventually(t, "the fenced agent registers again", func() bool {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		return e.api.registrations > registrations
	})
	silence(false)
	eventually(t, "the agent serves again", func() bool { return a.outOfService() == "" })
	// The execution outlived the stream that assigned it: it still does
	// what ctrl asks.
	e.api.await(t, e.api.assign(as.ExecutionId, stopped(as, ctrlv1.StopMode_STOP_MODE_NORMAL, "stop")), as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPED)

	// The lease is checked where calls are admitted too, not only by the
	// timer: a process frozen past its lease may admit a waiting call
	// before the timer's goroutine runs.
	a.fenceTimer.Stop()
	long := time.Now().Add(-lease)
	a.contact.Store(&long)
	if why := a.outOfService(); !strings.Contains(why, "within its lease") {
		t.Errorf("a lapsed lease whose timer has not fired: out of service %q, want fenced", why)
	}
}

// TestOutOfServiceUntilRegistered: an agent that has not registered since
// it started serves nothing, saying so, not that a lease of it lapsed
// (none has: its workspaces may still run here).
func TestOutOfServiceUntilRegistered(t *testing.T) {
	e := newReconcilerEnv(t)
	e.api.mu.Lock()
	e.api.silent = true
	e.api.mu.Unlock()
	a, _ := e.runAgent(t, e.driver)
	eventually(t, "the agent tried to register", func() bool {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		return e.api.registrations > 0
	})
	if why := a.outOfService(); why != "it has not registered with the control plane since it started" {
		t.Errorf("out of service %q before a registration was taken, want that it has not registered since it started", why)
	}
	e.api.mu.Lock()
	e.api.silent = false
	e.api.notify()
	e.api.mu.Unlock()
	eventually(t, "the registered agent serves", func() bool { return a.outOfService() == "" })
}

// TestReplacedAgentServesNothing: an agent whose assignment stream ctrl
// ends because another agent registered the host's name serves nothing,
// saying why, until a registration of its own is taken again.
func TestReplacedAgentServesNothing(t *testing.T) {
	e := newReconcilerEnv(t)
	a, _ := e.runAgent(t, e.driver)
	eventually(t, "the registered agent serves", func() bool { return a.outOfService() == "" })
	replace := func(replaced bool) {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		e.api.replaced = replaced
		e.api.notify()
	}
	replace(true)
	eventually(t, "the replaced agent serves nothing", func() bool {
		return strings.Contains(a.outOfService(), "served by another agent now")
	})
	replace(false)
	eventually(t, "the agent serves again", func() bool { return a.outOfService() == "" })
}

// TestRefusedCredentials: an agent whose registration the control plane
// refuses (unauthenticated: its token revoked) marks itself refused and
// reports nothing, not even a heartbeat, which would renew the lease of
// the host whose name it asks for; it is accepted again, and reports,
// once a registration succeeds.
func TestRefusedCredentials(t *testing.T) {
	e := newReconcilerEnv(t)
	e.api.mu.Lock()
	e.api.refuse = true
	e.api.mu.Unlock()
	a, _ := e.runAgent(t, e.driver)
	count := func() (registrations, reports int) {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		return e.api.registrations, e.api.reportCalls
	}
	eventually(t, "the agent marks itself refused", func() bool { return a.refusal.Load() != nil })
	eventually(t, "the agent asks to register again", func() bool { r, _ := count(); return r >= 3 })
	time.Sleep(heartbeat + time.Second) // a heartbeat's time
	if _, reports := count(); reports != 0 {
		t.Errorf("a refused agent sent %d reports", reports)
	}
	e.api.mu.Lock()
	e.api.refuse = false
	e.api.mu.Unlock()
	eventually(t, "the agent is accepted again", func() bool { return a.refusal.Load() == nil })
	eventually(t, "the registered agent reports", func() bool { _, reports := count(); return reports > 0 })
}
