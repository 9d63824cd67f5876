// Package agent is the agent that runs a host's executions. It talks to
// ctrl only through the host API (kibotos.host.v1): it registers, watches
// its complete desired set of executions, converges each one through a
// runtime driver, and reports what it observes. It is level-triggered:
// after a restart of either side it recovers running executions from the
// runtime and converges again, so nothing is lost.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// Timings of the agent.
const (
	// readyTimeout bounds how long a started guest may take to answer.
	readyTimeout = 60 * time.Second
	// stopGrace is how long a NORMAL stop lets guest processes end.
	stopGrace = 10 * time.Second
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
	// DataPlaneEndpoint is the base URL callers reach this host's
	// data-plane gateway at.
	DataPlaneEndpoint string
	// Network configures the executions' network slots.
	Network NetworkConfig
	// StoragePools are the storage pools the host reaches.
	StoragePools []StoragePool
}

// Agent converges a host's executions to ctrl's assignments.
type Agent struct {
	cfg Config

	mu    sync.Mutex
	execs map[string]*execution
	// running tracks the execution goroutines, which Run waits for.
	running sync.WaitGroup
	// layers serializes work on one writable layer across the executions
	// (generations) of one workspace.
	layers sync.Map // layer ID → *sync.Mutex

	reports chan *hostv1.ExecutionReport
	// vols keeps the Volume images; volumeReports carries their reports.
	vols          *volumes
	volumeReports chan *hostv1.VolumeReport
	// registered is closed once ctrl has accepted the registration.
	registered     chan struct{}
	registeredOnce sync.Once
}

// Registered is closed once the host is registered with ctrl, so that
// placement can find it.
func (a *Agent) Registered() <-chan struct{} { return a.registered }

// New returns an Agent.
func New(cfg Config) (*Agent, error) {
	if err := os.MkdirAll(cfg.LayerDir, 0o700); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, execs: map[string]*execution{}, reports: make(chan *hostv1.ExecutionReport, 256),
		volumeReports: make(chan *hostv1.VolumeReport, 256), registered: make(chan struct{})}
	vols, err := newVolumes(a, cfg.StoragePools)
	if err != nil {
		return nil, err
	}
	a.vols = vols
	return a, nil
}

// Run registers the host and converges until ctx ends. It survives ctrl
// restarts by reconnecting.
func (a *Agent) Run(ctx context.Context) error {
	// A leftover that cannot be released now must not keep the host from
	// serving: adopt what runs, and converge releases the rest later.
	running, err := a.cfg.Driver.Recover(ctx)
	if err != nil {
		slog.Error("recovering executions (continuing with those found running)", "err", err)
	}
	for _, id := range running {
		slog.Info("recovered running execution", "execution", id)
		a.adopt(ctx, id)
	}
	a.releaseSlotsExcept(running)
	a.vols.probe(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { a.sendReports(ctx) })
	wg.Go(func() { a.vols.run(ctx) })
	wg.Go(func() { a.watchHostAddresses(ctx) })
	for backoff := 100 * time.Millisecond; ctx.Err() == nil; {
		err := a.watch(ctx)
		if ctx.Err() != nil {
			break
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

func (a *Agent) watch(ctx context.Context) error {
	reg := &hostv1.RegisterHostRequest{HostId: a.cfg.HostID, Capacity: a.cfg.Capacity, Runtimes: a.cfg.Runtimes,
		DataPlaneEndpoint: a.cfg.DataPlaneEndpoint, StoragePools: a.vols.registration()}
	if len(reg.StoragePools) > 0 {
		reg.Capabilities = append(reg.Capabilities, "volume.storage_pool")
	}
	if _, err := a.cfg.Client.RegisterHost(ctx, connect.NewRequest(reg)); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	a.registeredOnce.Do(func() { close(a.registered) })
	stream, err := a.cfg.Client.WatchAssignments(ctx, connect.NewRequest(&hostv1.WatchAssignmentsRequest{HostId: a.cfg.HostID}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		// Volumes first: a starting execution opens its Volume by them.
		a.vols.set(stream.Msg().GetVolumes())
		a.converge(ctx, stream.Msg().GetAssignments())
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
		e.set(as)
	}
	for id, e := range a.execs {
		if !assigned[id] {
			e.set(nil)
		}
	}
}

// adopt tracks an execution found running at start.
func (a *Agent) adopt(ctx context.Context, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.newExecution(ctx, id, true).reopenSlot()
}

func (a *Agent) newExecution(ctx context.Context, id string, running bool) *execution {
	ctx, cancel := context.WithCancel(ctx)
	e := &execution{agent: a, id: id, wake: make(chan struct{}, 1), exited: make(chan runtime.Status, 1), cancel: cancel}
	e.setRunning(ctx, running)
	a.execs[id] = e
	a.running.Go(func() { e.run(ctx) })
	return e
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
	return true
}

func (a *Agent) layerLock(id string) *sync.Mutex {
	m, _ := a.layers.LoadOrStore(id, new(sync.Mutex))
	return m.(*sync.Mutex)
}

// report queues a report for ctrl.
func (a *Agent) report(r *hostv1.ExecutionReport) {
	r.ObservedAt = timestamppb.Now()
	select {
	case a.reports <- r:
	default:
		slog.Warn("report queue full; the next heartbeat carries the state", "execution", r.ExecutionId)
	}
}

// sendReports sends queued reports and, every heartbeat, the last report
// of every execution again, so a restarted ctrl learns everything.
func (a *Agent) sendReports(ctx context.Context) {
	ticker := time.NewTicker(heartbeat)
	defer ticker.Stop()
	// pending keeps reports in the order they were made until ctrl has
	// taken them; a failed call keeps them for the next attempt.
	var pending []*hostv1.ExecutionReport
	// pendingVolumes keeps only the latest report of each Volume: each is
	// complete.
	pendingVolumes := map[string]*hostv1.VolumeReport{}
	for {
		heartbeatDue := false
		select {
		case <-ctx.Done():
			return
		case r := <-a.reports:
			pending = append(pending, r)
		case r := <-a.volumeReports:
			pendingVolumes[r.VolumeId] = r
		case <-ticker.C:
			heartbeatDue = true
		}
	drain:
		for {
			select {
			case r := <-a.reports:
				pending = append(pending, r)
			case r := <-a.volumeReports:
				pendingVolumes[r.VolumeId] = r
			default:
				break drain
			}
		}
		if heartbeatDue {
			// After everything queued, so nothing older follows it.
			a.mu.Lock()
			for _, e := range a.execs {
				if r := e.lastReport(); r != nil {
					pending = append(pending, r)
				}
			}
			a.mu.Unlock()
			for _, r := range a.vols.latest() {
				pendingVolumes[r.VolumeId] = r
			}
		}
		if len(pending) == 0 && len(pendingVolumes) == 0 {
			continue
		}
		req := &hostv1.ReportExecutionsRequest{HostId: a.cfg.HostID, Reports: pending}
		for _, r := range pendingVolumes {
			req.Volumes = append(req.Volumes, r)
		}
		callCtx, cancel := context.WithTimeout(ctx, reportTimeout)
		_, err := a.cfg.Client.ReportExecutions(callCtx, connect.NewRequest(req))
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				slog.Warn("report to ctrl failed; retrying with the next report or heartbeat", "err", err)
			}
			if len(pending) > maxPendingReports {
				pending = pending[len(pending)-maxPendingReports:]
			}
			continue
		}
		pending = nil
		clear(pendingVolumes)
	}
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

// deliver makes the template's layers locally usable, fetching missing
// blobs from ctrl, and reports progress.
func (a *Agent) deliver(ctx context.Context, as *hostv1.Assignment, progress func(done, total uint64)) ([]string, error) {
	img := imagestore.Image{ManifestDigest: as.Template.ImageDigest}
	for _, l := range as.Template.Layers {
		img.Layers = append(img.Layers, imagestore.Layer{Digest: l.Digest, DiffID: l.DiffId, Size: int64(l.SizeBytes)})
		if !a.cfg.Template.HasBlob(l.Digest) {
			if err := a.fetchBlob(ctx, l.Digest); err != nil {
				return nil, err
			}
		}
	}
	return a.cfg.Template.Unpack(ctx, img, progress)
}

func (a *Agent) fetchBlob(ctx context.Context, digest string) error {
	stream, err := a.cfg.Client.GetTemplateBlob(ctx, connect.NewRequest(&hostv1.GetTemplateBlobRequest{Digest: digest}))
	if err != nil {
		return err
	}
	defer stream.Close()
	pr, pw := io.Pipe()
	go func() {
		for stream.Receive() {
			if _, err := pw.Write(stream.Msg().Data); err != nil {
				return
			}
		}
		pw.CloseWithError(stream.Err())
	}()
	err = a.cfg.Template.PutBlob(digest, pr)
	pr.CloseWithError(err)
	return err
}

// execution converges one execution.
type execution struct {
	agent  *Agent
	id     string
	cancel context.CancelFunc
	wake   chan struct{}

	mu      sync.Mutex
	desired *hostv1.Assignment
	known   bool // desired has been set at least once
	last    *hostv1.ExecutionReport
	slot    *netslot.Slot // the network slot while the execution runs

	// reportMu orders reports: a slot's change never re-sends RUNNING
	// after the execution reported something else.
	reportMu sync.Mutex

	// exited receives the status of init when it ends on its own.
	exited chan runtime.Status

	// Owned by run.
	running bool
	// stopWaiting ends the exit watch of the running execution.
	stopWaiting context.CancelFunc
	// pendingExit holds an exit seen before any assignment named the
	// execution.
	pendingExit *runtime.Status
	// memory is the memory limit the running execution has; zero when
	// unknown (adopted after a restart).
	memory uint64
}

// setRunning records whether the execution runs and, while it does,
// watches for its init to end (the driver waits on a pidfd: no polling of
// the runtime).
func (e *execution) setRunning(ctx context.Context, running bool) {
	if e.stopWaiting != nil {
		e.stopWaiting()
		e.stopWaiting = nil
	}
	e.running = running
	if !running {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	e.stopWaiting = cancel
	go func() {
		st, err := e.agent.cfg.Driver.Wait(wctx, e.id)
		if err != nil || wctx.Err() != nil {
			return
		}
		select {
		case e.exited <- st:
		default:
		}
	}()
}

func (e *execution) set(as *hostv1.Assignment) {
	e.mu.Lock()
	e.desired, e.known = as, true
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *execution) get() (*hostv1.Assignment, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.desired, e.known
}

func (e *execution) lastReport() *hostv1.ExecutionReport {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last == nil {
		return nil
	}
	return proto.CloneOf(e.last)
}

// report records and sends a report about this execution.
func (e *execution) report(as *hostv1.Assignment, r *hostv1.ExecutionReport) {
	e.reportMu.Lock()
	defer e.reportMu.Unlock()
	e.send(as, r)
}

// send records and sends a report; reportMu is held.
func (e *execution) send(as *hostv1.Assignment, r *hostv1.ExecutionReport) {
	r.ExecutionId, r.WorkspaceId, r.Generation = e.id, as.WorkspaceId, as.Generation
	e.mu.Lock()
	e.last = proto.CloneOf(r)
	e.mu.Unlock()
	e.agent.report(r)
}

func (e *execution) run(ctx context.Context) {
	defer e.cancel()
	for {
		as, known := e.get()
		if known && as == nil {
			// No longer assigned: stop (keeping the layer; Stop is
			// idempotent and also releases leftovers) and forget, unless
			// it was assigned again meanwhile or the stop failed.
			if e.stop(ctx, nil, runtime.StopNormal) && e.agent.forgetIfUnassigned(e) {
				return
			}
		}
		if as != nil && e.pendingExit != nil {
			st := *e.pendingExit
			e.pendingExit = nil
			e.exit(ctx, as, st)
		}
		if as != nil {
			e.step(ctx, as)
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case st := <-e.exited:
			switch {
			case e.running && as != nil:
				e.exit(ctx, as, st)
			case e.running:
				// Adopted after a restart, before ctrl's first assignment:
				// report the exit once it is known what it served.
				e.pendingExit = &st
			}
		case <-time.After(checkEvery):
		}
	}
}

// step takes one action toward the assignment.
func (e *execution) step(ctx context.Context, as *hostv1.Assignment) {
	switch as.Desired {
	case hostv1.DesiredState_DESIRED_STATE_RUNNING:
		if !e.running {
			// A failed or exited execution is never started again on its
			// own: ctrl starts another one (a new execution ID).
			if last := e.lastReport(); last != nil && (last.State == hostv1.ObservedState_OBSERVED_STATE_FAILED ||
				last.State == hostv1.ObservedState_OBSERVED_STATE_EXITED) {
				return
			}
			e.start(ctx, as)
			return
		}
		e.observe(ctx, as)
	case hostv1.DesiredState_DESIRED_STATE_STOPPED:
		mode := runtime.StopNormal
		if as.GetStop().GetMode() == ctrlv1.StopMode_STOP_MODE_FORCE {
			mode = runtime.StopForce
		}
		if last := e.lastReport(); e.running || last == nil || last.State != hostv1.ObservedState_OBSERVED_STATE_STOPPED {
			e.stop(ctx, as, mode)
		}
	case hostv1.DesiredState_DESIRED_STATE_DELETED:
		if last := e.lastReport(); last == nil || last.State != hostv1.ObservedState_OBSERVED_STATE_DELETED {
			e.delete(ctx, as)
		}
	}
}

func (e *execution) start(ctx context.Context, as *hostv1.Assignment) {
	lock := e.agent.layerLock(as.LayerId)
	lock.Lock()
	defer lock.Unlock()
	fail := func(stage ctrlv1.FailureStage, err error) {
		slog.Error("execution failed to start", "execution", e.id, "err", err)
		e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
			FailureStage: stage, FailureReason: reasonOf(err), FailureMessage: err.Error()})
	}
	delivering := &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_DELIVERING}
	lastSent := time.Time{}
	layers, err := e.agent.deliver(ctx, as, func(done, total uint64) {
		delivering.DeliveryBytesDelivered, delivering.DeliveryBytesTotal = done, total
		if time.Since(lastSent) > 200*time.Millisecond || done == total {
			lastSent = time.Now()
			e.report(as, proto.CloneOf(delivering))
		}
	})
	if err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_CREATING, fmt.Errorf("deliver template %s@%s: %w", as.Template.TemplateId, as.Template.Revision, err))
		return
	}
	e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_STARTING})
	path := e.agent.layerPath(as.LayerId)
	_, statErr := os.Stat(path)
	continued := statErr == nil
	if err := e.agent.cfg.Layers.CreateLayer(ctx, path, as.Resources.GetWritableLayerBytes()); err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_CREATING, fmt.Errorf("writable layer: %w", err))
		return
	}
	// ResizeWorkspaceWritableLayer grew the request while it was stopped.
	if err := e.agent.cfg.Layers.GrowLayer(ctx, path, as.Resources.GetWritableLayerBytes()); err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_WRITABLE_LAYER, fmt.Errorf("growing the writable layer: %w", err))
		return
	}
	var volume *runtime.VolumeMount
	if as.Volume != nil {
		image, unlock, stage, err := e.agent.vols.open(ctx, as.Volume)
		if err != nil {
			fail(stage, err)
			return
		}
		defer unlock() // once the execution has it mounted, nothing else can
		volume = &runtime.VolumeMount{Image: image, Path: as.Volume.MountPath}
	}
	slot, err := e.createSlot(as)
	if err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_APPLYING_NETWORK, err)
		return
	}
	spec := runtime.Spec{
		ID: e.id, Layers: layers, LayerImage: path,
		CPUMillis: as.Resources.GetCpuMillis(), MemoryBytes: as.Resources.GetMemoryBytes(), PidsLimit: pidsLimit,
		GuestAgent: e.agent.cfg.GuestAgent, Hostname: as.WorkspaceId, Env: as.Template.GetEnv(),
		NetNS: slot.Path(), ResolvConf: netslot.ResolvConf(e.agent.cfg.Network.DeploymentResolvers),
		Volume: volume,
	}
	if err := e.agent.cfg.Driver.Start(ctx, spec); err != nil {
		e.releaseSlot()
		fail(ctrlv1.FailureStage_FAILURE_STAGE_STARTING, err)
		return
	}
	e.setRunning(ctx, true)
	e.memory = spec.MemoryBytes
	probeCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		err := e.agent.cfg.Driver.Probe(probeCtx, e.id)
		if err == nil {
			break
		}
		if probeCtx.Err() != nil {
			e.setRunning(ctx, false)
			e.agent.cfg.Driver.Stop(ctx, e.id, runtime.StopForce, 0)
			e.releaseSlot()
			fail(ctrlv1.FailureStage_FAILURE_STAGE_WAITING_FOR_READINESS, fmt.Errorf("guest agent did not answer within %s: %w", readyTimeout, err))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	capacity, _ := e.agent.cfg.Layers.LayerCapacity(path)
	e.report(as, e.withNetwork(&hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_RUNNING,
		LayerCapacityBytes: &capacity, LayerContinued: continued}))
}

// observe reports a running execution that has not been reported as
// running for this assignment yet (one adopted after a restart).
func (e *execution) observe(ctx context.Context, as *hostv1.Assignment) {
	e.applyNetwork(as)
	e.applyMemory(ctx, as)
	if last := e.lastReport(); last != nil && last.State == hostv1.ObservedState_OBSERVED_STATE_RUNNING && last.Generation == as.Generation {
		return
	}
	if e.agent.cfg.Driver.Probe(ctx, e.id) == nil {
		capacity, _ := e.agent.cfg.Layers.LayerCapacity(e.agent.layerPath(as.LayerId))
		e.report(as, e.withNetwork(&hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_RUNNING,
			LayerCapacityBytes: &capacity, LayerContinued: true}))
	}
}

// applyMemory gives the running execution the memory its assignment
// says (UpdateWorkspaceMemory raises it live).
func (e *execution) applyMemory(ctx context.Context, as *hostv1.Assignment) {
	want := as.Resources.GetMemoryBytes()
	if want == 0 || want == e.memory {
		return
	}
	if err := e.agent.cfg.Driver.SetMemory(ctx, e.id, want); err != nil {
		slog.Error("changing the memory of a running execution", "execution", e.id, "bytes", want, "err", err)
		return
	}
	e.memory = want
}

// exit releases an execution whose init ended on its own and tells ctrl.
func (e *execution) exit(ctx context.Context, as *hostv1.Assignment, st runtime.Status) {
	e.agent.cfg.Driver.Stop(ctx, e.id, runtime.StopForce, 0)
	e.releaseSlot()
	e.setRunning(ctx, false)
	e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_EXITED, OomKilled: st.OOMKilled})
}

// stop ends the execution and reports true once nothing of it runs.
func (e *execution) stop(ctx context.Context, as *hostv1.Assignment, mode runtime.StopMode) bool {
	var layerID string
	if as != nil {
		layerID = as.LayerId
		lock := e.agent.layerLock(layerID)
		lock.Lock()
		defer lock.Unlock()
		e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_STOPPING})
	}
	e.setRunning(ctx, false) // a deliberate stop is not an exit
	res, err := e.agent.cfg.Driver.Stop(ctx, e.id, mode, stopGrace)
	if err == nil {
		err = e.releaseSlot()
	}
	if err != nil {
		slog.Error("stop failed", "execution", e.id, "err", err)
		if as != nil {
			e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
				FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_STOPPING, FailureReason: reasonOf(err), FailureMessage: err.Error()})
		}
		return false
	}
	if as == nil {
		return true
	}
	durability := ctrlv1.StopDurability_STOP_DURABILITY_UNCONFIRMED
	if res.Confirmed {
		durability = ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED
	}
	r := &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_STOPPED,
		StopDurability: durability, StopCommandId: as.GetStop().GetCommandId()}
	if capacity, err := e.agent.cfg.Layers.LayerCapacity(e.agent.layerPath(layerID)); err == nil {
		r.LayerCapacityBytes = &capacity
	}
	e.report(as, r)
	return true
}

func (e *execution) delete(ctx context.Context, as *hostv1.Assignment) {
	lock := e.agent.layerLock(as.LayerId)
	lock.Lock()
	defer lock.Unlock()
	e.setRunning(ctx, false)
	_, err := e.agent.cfg.Driver.Stop(ctx, e.id, runtime.StopForce, 0)
	if err == nil {
		err = e.releaseSlot()
	}
	if err != nil {
		e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
			FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_DELETING, FailureReason: reasonOf(err), FailureMessage: err.Error()})
		return
	}
	if err := e.agent.cfg.Layers.DeleteLayer(e.agent.layerPath(as.LayerId)); err != nil {
		e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
			FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_DELETING, FailureReason: reasonOf(err), FailureMessage: err.Error()})
		return
	}
	e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_DELETED})
}

// reasonOf classifies a failure for ctrl.
func reasonOf(err error) ctrlv1.FailureReason {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT
	case errors.Is(err, context.Canceled):
		return ctrlv1.FailureReason_FAILURE_REASON_CANCELLED
	}
	return ctrlv1.FailureReason_FAILURE_REASON_INTERNAL
}
