// Package agent is the agent that runs a host's executions. It talks to
// ctrl only through the host API (kibotos.host.v1): it registers, watches
// its complete desired set of executions, converges each one through a
// runtime driver, and reports what it observes. It is level-triggered:
// after a restart of either side it recovers running executions from the
// runtime and converges again, so nothing is lost.
package agent

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/psi"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// Timings of the agent.
const (
	// defaultReadyTimeout bounds how long a started guest may take to
	// answer.
	defaultReadyTimeout = 60 * time.Second
	// defaultStopGrace is how long a NORMAL stop lets guest processes end.
	defaultStopGrace = 10 * time.Second
	// heartbeat is how often every execution's state is reported again.
	heartbeat = 5 * time.Second
	// checkEvery is how often a running execution is observed.
	checkEvery = time.Second
	// pidsLimit bounds the tasks of one execution.
	pidsLimit = 4096
	// reportTimeout bounds one ReportExecutions call.
	reportTimeout = 10 * time.Second
	// maxPendingReports bounds the reports kept while ctrl is unreachable;
	// the heartbeat re-sends every execution's latest state anyway.
	maxPendingReports = 1000
)

// Config configures an Agent.
type Config struct {
	HostID   string
	Client   hostv1connect.HostServiceClient
	Driver   runtime.Driver
	Layers   runtime.Layers
	Template *imagestore.Store
	// LayerDir holds the writable layer images, one per workspace.
	LayerDir string
	// GuestAgent is the host path of the kibotos-guest binary.
	GuestAgent string
	Capacity   *hostv1.HostCapacity
	Runtimes   []string
	// Capabilities are what the host offers beyond screen, input and
	// volume.storage_pool (which it offers with a storage pool), such as
	// runtime.gvisor.
	Capabilities []string
	// Launches are the exact launches the host runs executions with, the
	// one it prefers first; it runs an execution bound to another launch
	// not at all. Empty registers none, and any binding runs.
	Launches []*hostv1.Launch
	// DataPlaneEndpoint is the base URL callers reach this host's
	// data-plane gateway at.
	DataPlaneEndpoint string
	// ExposureDomain, when set, is the DNS name under which the host serves
	// exposures by host name (<port>-<workspace>.<domain>, see
	// exposureabi), and only so; empty serves them by path.
	ExposureDomain string
	// ExposureEndpoint, when set, is the base URL callers reach a listener
	// of the host's that serves only Exposures at: path URLs are under it
	// rather than DataPlaneEndpoint.
	ExposureEndpoint string
	// Network configures the executions' network slots.
	Network NetworkConfig
	// StoragePools are the storage pools the host reaches.
	StoragePools []StoragePool
	// GuestProbeInterval is how often the guest of each running execution
	// is probed; zero is DefaultGuestProbeInterval.
	GuestProbeInterval time.Duration
	// Metrics, when set, is where the host's counters are registered,
	// labeled with HostID.
	Metrics prometheus.Registerer
	// GuestMemory says when the memory pressure each probe reads saturates
	// a guest and when its largest process is killed; zero fields are
	// psi.DefaultThresholds'.
	GuestMemory psi.Thresholds
	// WarmPool is how many executions the host keeps started ahead of
	// time for the latest shape of start it served (pool.go); zero keeps
	// none. A driver that is no runtime.Binder keeps none either.
	WarmPool int
	// CallsPerProject bounds the data-plane calls in flight of one
	// project's workspaces at the gateway (callshare); zero bounds none.
	CallsPerProject int
}

// Agent converges a host's executions to ctrl's assignments.
type Agent struct {
	// cfg.Driver is the aliasDriver over driver, the host's own.
	cfg    Config
	driver runtime.Driver
	// pool keeps executions started ahead of time.
	pool *warmPool

	mu    sync.Mutex
	execs map[string]*execution
	// byWorkspace files the executions of execs under their workspace
	// once they have an assignment: the data plane finds a workspace's
	// execution at every call, among a thousand on a dense host.
	byWorkspace map[string][]*execution
	// running tracks the execution goroutines, which Run waits for.
	running sync.WaitGroup
	// layers serializes work on one writable layer across the executions
	// (generations) of one workspace.
	layers sync.Map // layer ID → *sync.Mutex

	reports chan *hostv1.ExecutionReport
	// vols keeps the Volume images; volumeReports carries their reports.
	vols          *volumes
	volumeReports chan *hostv1.VolumeReport
	// exports runs the assigned exports; transferReports carries the
	// progress of exports and restores.
	exports         *exports
	transferReports chan *hostv1.TransferReport
	// ownAddresses are the host's own addresses as watchHostAddresses
	// last found them; nil before it first did.
	ownAddresses atomic.Pointer[[]netip.Prefix]
	// reportInterval is how often ctrl asked to hear from the host (its
	// lease); zero before the registration.
	reportInterval atomic.Int64
	// registeredNow wakes the reports after each registration.
	registeredNow chan struct{}
	// converged is set once ctrl's first assignments were handed out.
	converged atomic.Bool
	// collectNow wakes collectLayers.
	collectNow chan struct{}
	// registered is closed once ctrl has accepted the registration;
	// serving once the host first serves (fence.go).
	registered     chan struct{}
	registeredOnce sync.Once
	serving        chan struct{}
	servingOnce    sync.Once
	// refusal is why ctrl refuses this agent, while it does (its token
	// revoked, its name another token's or another agent's): the host
	// then serves no data-plane call, as its workspaces are no longer its
	// to serve (fence.go).
	refusal atomic.Pointer[string]
	// lease is ctrl's host lease, from the registration; contact is when
	// the last registration or report ctrl took was sent (with its
	// monotonic reading: a change of the wall clock moves no lease);
	// fenced is set once a lease passed without one (fence.go), by
	// fenceTimer; cutWatch ends the current assignment stream.
	lease      atomic.Int64
	contact    atomic.Pointer[time.Time]
	fenced     atomic.Bool
	fenceTimer *time.Timer
	cutWatch   atomic.Pointer[context.CancelFunc]
	// readyTimeout is defaultReadyTimeout; tests shorten it.
	readyTimeout time.Duration
	// stopGrace is defaultStopGrace; tests lengthen it.
	stopGrace time.Duration
	// stateID names the state of this host's layer directory
	// (loadStateID).
	stateID string
	// probeEvery is how often running guests are probed, probeTimeout
	// (defaultProbeTimeout; tests lengthen it) how long one probe may
	// take; probes are those probed (health.go).
	probeEvery   time.Duration
	probeTimeout time.Duration
	probes       guestProbes
	// counters are what the host counts for its metrics.
	counters counters
	// guestConns are the HTTP/2 connections to the guest agents.
	guestConns guestConnections
	// slotSockets is the host sockets all network slots may hold at once.
	slotSockets *netslot.SocketBudget
	// guestClient carries DialGuestPort's calls to the guest agents.
	guestClient     *http.Client
	guestClientOnce sync.Once
}

// Registered is closed once the host is registered with ctrl, so that
// placement can find it.
func (a *Agent) Registered() <-chan struct{} { return a.registered }

// Serving is closed once the host first serves the data plane: registered,
// and the assignments that came with it applied.
func (a *Agent) Serving() <-chan struct{} { return a.serving }

// New returns an Agent.
func New(cfg Config) (*Agent, error) {
	if err := os.MkdirAll(cfg.LayerDir, 0o700); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, execs: map[string]*execution{}, reports: make(chan *hostv1.ExecutionReport, 256),
		volumeReports: make(chan *hostv1.VolumeReport, 256), registered: make(chan struct{}), serving: make(chan struct{}), registeredNow: make(chan struct{}, 1), collectNow: make(chan struct{}, 1), readyTimeout: defaultReadyTimeout, stopGrace: defaultStopGrace,
		probeEvery: cmp.Or(cfg.GuestProbeInterval, DefaultGuestProbeInterval), probeTimeout: defaultProbeTimeout,
		slotSockets: newSlotSockets()}
	a.fenced.Store(true) // until ctrl takes its registration
	a.fenceTimer = time.AfterFunc(time.Hour, a.fence)
	a.fenceTimer.Stop()
	var err error
	if a.stateID, err = loadStateID(cfg.LayerDir); err != nil {
		return nil, err
	}
	vols, err := newVolumes(a, cfg.StoragePools)
	if err != nil {
		return nil, err
	}
	a.vols = vols
	a.driver = cfg.Driver
	if a.pool, err = newWarmPool(a, cfg.WarmPool, filepath.Join(cfg.LayerDir, ".pool"), cfg.Driver); err != nil {
		return nil, err
	}
	a.cfg.Driver = aliasDriver{Driver: cfg.Driver, pool: a.pool}
	a.exports, a.transferReports = newExports(a), make(chan *hostv1.TransferReport, 64)
	if cfg.Metrics != nil {
		if err := a.registerMetrics(cfg.Metrics); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Run registers the host and converges until ctx ends. It survives ctrl
// restarts by reconnecting.
func (a *Agent) Run(ctx context.Context) error {
	a.recoverExecutions(ctx)
	a.releaseTransferMounts()
	a.vols.probe(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer a.exports.wg.Wait()
	wg.Go(func() { a.sendReports(ctx) })
	wg.Go(func() { a.vols.run(ctx) })
	wg.Go(func() { a.watchHostAddresses(ctx) })
	wg.Go(func() { a.collectLayers(ctx) })
	wg.Go(func() { a.pool.run(ctx) })
	wg.Go(func() { a.probeGuests(ctx) })
	for backoff := 100 * time.Millisecond; ctx.Err() == nil; {
		err := a.watch(ctx)
		if ctx.Err() != nil {
			break
		}
		// A refused registration or stream (the credentials, or another
		// agent's registration under the name) holds until one is taken.
		switch connect.CodeOf(err) {
		case connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeFailedPrecondition:
			why := connect.CodeOf(err).String() + ": " + refusalMessage(err)
			if a.refusal.Swap(&why) == nil {
				slog.Error("the control plane refuses this agent; it serves no data-plane call until a registration is taken again", "err", err)
			}
		}
		slog.Warn("assignment stream ended; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	a.mu.Lock()
	for _, e := range a.execs {
		e.cancel()
	}
	a.mu.Unlock()
	a.running.Wait() // nothing changes the state directory after Run
	return nil
}

// watch registers the host and converges on the assignments of one
// stream until it ends. The executions it makes live on ctx, not the
// stream's: streams come and go (a ctrl restart, a fence), executions stay.
func (a *Agent) watch(ctx context.Context) error {
	streamCtx, cancel := a.watchContext(ctx)
	defer cancel()
	// Every runtime runs the display of a template that carries one, and
	// the guest agent serves its screen and input.
	reg := &hostv1.RegisterHostRequest{HostId: a.cfg.HostID, Capacity: a.cfg.Capacity, Runtimes: a.cfg.Runtimes,
		DataPlaneEndpoint: a.cfg.DataPlaneEndpoint, ExposureDomain: a.cfg.ExposureDomain, ExposureEndpoint: a.cfg.ExposureEndpoint,
		StoragePools: a.vols.registration(),
		Capabilities: append([]string{guestabi.CapabilityScreen, guestabi.CapabilityInput}, a.cfg.Capabilities...), Launches: a.cfg.Launches,
		StateId: a.stateID}
	if len(reg.StoragePools) > 0 {
		reg.Capabilities = append(reg.Capabilities, guestabi.CapabilityStoragePool)
	}
	sent := time.Now()
	resp, err := a.cfg.Client.RegisterHost(ctx, connect.NewRequest(reg))
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	a.refusal.Store(nil)
	a.reportInterval.Store(int64(resp.Msg.GetReportInterval().AsDuration()))
	// A ctrl that does not say its lease has the one its report interval
	// is a third of.
	a.lease.Store(int64(cmp.Or(resp.Msg.GetHostLease().AsDuration(), 3*resp.Msg.GetReportInterval().AsDuration())))
	a.heard(sent)
	select { // report at once, and from now on as often as ctrl asks
	case a.registeredNow <- struct{}{}:
	default:
	}
	a.registeredOnce.Do(func() { close(a.registered) })
	stream, err := a.cfg.Client.WatchAssignments(streamCtx, connect.NewRequest(&hostv1.WatchAssignmentsRequest{HostId: a.cfg.HostID, StateId: a.stateID}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		// Volumes first: a starting execution opens its Volume by them.
		a.vols.set(stream.Msg().GetVolumes())
		a.converge(ctx, stream.Msg().GetAssignments())
		a.closeDeletedEgresses(stream.Msg().GetDeletedEgressIds())
		a.exports.set(ctx, stream.Msg().GetTransfers())
		a.unfence()
	}
	return stream.Err()
}

// converge hands each assignment to its execution and tells executions
// that are no longer assigned to stop and forget themselves.
func (a *Agent) converge(ctx context.Context, assignments []*hostv1.Assignment) {
	a.mu.Lock()
	defer a.mu.Unlock()
	assigned := map[string]bool{}
	for _, as := range assignments {
		assigned[as.ExecutionId] = true
		e, ok := a.execs[as.ExecutionId]
		if !ok {
			e = a.newExecution(ctx, as.ExecutionId, false)
		}
		a.assign(e, as)
	}
	for id, e := range a.execs {
		if !assigned[id] {
			e.set(nil)
		}
	}
	if !a.converged.Swap(true) {
		a.kickCollector()
	}
	a.pool.kick() // the room the pool may take changed
}
func (a *Agent) newExecution(ctx context.Context, id string, running bool) *execution {
	ctx, cancel := context.WithCancel(ctx)
	e := &execution{agent: a, id: id, wake: make(chan struct{}, 1), exited: make(chan runtime.Status, 1), cancel: cancel}
	e.setRunning(ctx, running)
	a.execs[id] = e
	a.running.Go(func() { e.run(ctx) })
	return e
}

// assign hands as to e and files e under its workspace (an execution
// serves one workspace all its life); a.mu is held.
func (a *Agent) assign(e *execution, as *hostv1.Assignment) {
	e.set(as)
	if e.workspace != "" {
		return
	}
	e.workspace = as.WorkspaceId
	if a.byWorkspace == nil {
		a.byWorkspace = map[string][]*execution{}
	}
	a.byWorkspace[e.workspace] = append(a.byWorkspace[e.workspace], e)
}

// forgetIfUnassigned drops an execution that ctrl no longer assigns; it
// reports false when an assignment came back meanwhile.
func (a *Agent) forgetIfUnassigned(e *execution) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if as, _ := e.get(); as != nil {
		return false
	}
	delete(a.execs, e.id)
	a.kickCollector() // its layer may be one no workspace will use again
	if others := slices.DeleteFunc(a.byWorkspace[e.workspace], func(o *execution) bool { return o == e }); len(others) > 0 {
		a.byWorkspace[e.workspace] = others
	} else {
		delete(a.byWorkspace, e.workspace)
	}
	return true
}

func (a *Agent) layerLock(id string) *sync.Mutex {
	m, _ := a.layers.LoadOrStore(id, new(sync.Mutex))
	return m.(*sync.Mutex)
}

// executionMounting returns the execution assigned to run with a Volume;
// empty when none is.
func (a *Agent) executionMounting(volumeID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, e := range a.execs {
		if as, _ := e.get(); as.GetVolume().GetVolumeId() == volumeID && as.GetDesired() == hostv1.DesiredState_DESIRED_STATE_RUNNING {
			return id
		}
	}
	return ""
}

// layerPath is where a workspace's writable layer image lives.
func (a *Agent) layerPath(layerID string) string {
	return filepath.Join(a.cfg.LayerDir, layerID+".ext4")
}
