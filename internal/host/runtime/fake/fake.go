// Package fake is an in-memory runtime.Driver and runtime.Layers for fast
// tests of what sits above a driver (the host agent's reconciler): an
// execution is an entry in a map, its init a channel, and knobs inject what
// a real driver meets (a start that fails, an init that exits, a guest that
// never answers, a stop that is not confirmed or fails, memory that stays
// saturated). It passes the same
// suite as the real drivers (runtime/drivertest).
//
// Layer and volume images are real (sparse) files, so that callers which
// look at them on disk see what they would with a real driver; nothing is
// mounted and no process runs.
package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/psi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

var (
	_ runtime.Driver = (*Driver)(nil)
	_ runtime.Layers = (*Driver)(nil)
)

// ErrNeverReady is what Probe returns for a guest made NeverReady.
var ErrNeverReady = errors.New("fake: the guest agent does not answer")

// Driver is a fake driver over a machine; Restart returns another driver
// object over the same machine, as after a restart of the host agent.
type Driver struct {
	m *machine
}

// machine is what outlives a driver object: the executions, the images
// they hold, and the injected faults.
type machine struct {
	mu    sync.Mutex
	execs map[string]*execution
	// inUse maps a layer or volume image's absolute path to the execution
	// that holds it.
	inUse map[string]string

	failStart map[string]error
	// reserved holds the images ReserveLayer reserved, by absolute path
	// (a binding's rename moves the mark as it moves the blocks);
	// failReserve are the images whose reservation fails, with why.
	reserved    map[string]bool
	failReserve map[string]error
	// failRecover are the IDs Recover cannot settle, with why.
	failRecover map[string]error
	neverReady  map[string]bool
	// hung holds the CheckGuest calls of an ID until it is closed
	// (HangChecks); hanging counts those waiting.
	hung    map[string]chan struct{}
	hanging map[string]int
	// holdReady makes every execution started NeverReady.
	holdReady bool
	stops     map[string]stopOutcome
	// ignoreTerm are the IDs whose guest ignores a NORMAL stop
	// (IgnoreTerm).
	ignoreTerm map[string]bool
	// starts counts the successful starts of each ID.
	starts map[string]int
	// dataPlane serves every guest's data socket; nil refuses it.
	dataPlane http.Handler
	// dataStreams bounds the streams a data socket's HTTP/2 connection
	// allows (0: Go's default); dataDials counts the data sockets dialed,
	// each of which takes dataDialTime.
	dataStreams, dataDials int
	dataDialTime           time.Duration
}

type stopOutcome struct {
	res runtime.StopResult
	err error
}

// execution is one execution of the fake machine.
type execution struct {
	spec   runtime.Spec
	images []string
	memory uint64
	// ended is closed when init ends; status is then its final status.
	ended  chan struct{}
	status runtime.Status
	// oomKills counts the processes OOMKill killed.
	oomKills uint64
	// metrics, when set, is what Metrics returns (SetMetrics).
	metrics *metricsOutcome
	// procs are the guest's processes besides its agent (SetProcesses).
	procs []runtime.GuestProcess
	// stalled is the memory stall total before saturatedFrom; the total
	// grows with the clock from saturatedFrom while it is not zero.
	stalled       time.Duration
	saturatedFrom time.Time
	// noPressure hides the memory pressure (WithoutPressure).
	noPressure bool
}

type metricsOutcome struct {
	m   runtime.Metrics
	err error
}

// memoryPressure is the execution's memory pressure at now: every task
// stalled all the time while saturated, none otherwise; nil when hidden.
func (e *execution) memoryPressure(now time.Time) *psi.Pressure {
	if e.noPressure {
		return nil
	}
	total := e.stalled
	if !e.saturatedFrom.IsZero() {
		total += now.Sub(e.saturatedFrom)
	}
	return &psi.Pressure{Some: psi.Line{Total: total}, Full: psi.Line{Total: total}}
}

func (e *execution) running() bool {
	select {
	case <-e.ended:
		return false
	default:
		return true
	}
}

// New returns a driver over a new, empty machine.
func New() *Driver {
	return &Driver{m: &machine{execs: map[string]*execution{}, inUse: map[string]string{},
		failStart: map[string]error{}, reserved: map[string]bool{}, failReserve: map[string]error{}, failRecover: map[string]error{}, neverReady: map[string]bool{}, hung: map[string]chan struct{}{}, hanging: map[string]int{},
		stops: map[string]stopOutcome{}, ignoreTerm: map[string]bool{}, starts: map[string]int{}}}
}

// Restart returns a new driver object over the same machine: executions
// keep running, and the new driver finds them with Recover.
func (d *Driver) Restart() *Driver { return &Driver{m: d.m} }

// Name returns "fake".
func (d *Driver) Name() string { return "fake" }

// FailStart makes the next Start of id fail with err before it sets up
// anything.
func (d *Driver) FailStart(id string, err error) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.failStart[id] = err
}

// FailRecover makes Recover unable to settle id, as when the runtime's
// state of it cannot be read: Recover neither returns nor releases it,
// and fails with err.
func (d *Driver) FailRecover(id string, err error) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.failRecover[id] = err
}

// NeverReady makes Probe of id fail with ErrNeverReady until it is
// stopped.
func (d *Driver) NeverReady(id string) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.neverReady[id] = true
}

// HoldReady makes every execution started from now on NeverReady, until
// it is called with false (which answers none of them: see Answer).
func (d *Driver) HoldReady(on bool) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.holdReady = on
}

// HangChecks makes CheckGuest of id wait, as for a guest that takes the
// probe in but never answers, until its context ends or release is
// called; HangingChecks counts the calls waiting.
func (d *Driver) HangChecks(id string) (release func()) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	ch := make(chan struct{})
	d.m.hung[id] = ch
	return sync.OnceFunc(func() {
		d.m.mu.Lock()
		defer d.m.mu.Unlock()
		delete(d.m.hung, id)
		close(ch)
	})
}

// HangingChecks returns how many CheckGuest calls of id wait (HangChecks).
func (d *Driver) HangingChecks(id string) int {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.m.hanging[id]
}

// Answer undoes NeverReady: Probe of id answers again.
func (d *Driver) Answer(id string) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	delete(d.m.neverReady, id)
}

// OOMKill counts a process of a running execution as killed by its memory
// limit, as the kernel's counter would; it reports false when id does not
// run.
func (d *Driver) OOMKill(id string) bool {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e := d.m.execs[id]
	if e == nil || !e.running() {
		return false
	}
	e.oomKills++
	return true
}

// running returns execution id if it runs; mu is held.
func (m *machine) running(id string) *execution {
	if e := m.execs[id]; e != nil && e.running() {
		return e
	}
	return nil
}

// SetProcesses makes procs the processes of a running execution's guest
// besides its agent, as KillLargestProcess sees them; it reports false
// when id does not run.
func (d *Driver) SetProcesses(id string, procs []runtime.GuestProcess) bool {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e := d.m.running(id)
	if e == nil {
		return false
	}
	e.procs = slices.Clone(procs)
	return true
}

// Processes returns the processes of a running execution's guest besides
// its agent: those of SetProcesses that KillLargestProcess left.
func (d *Driver) Processes(id string) []runtime.GuestProcess {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if e := d.m.running(id); e != nil {
		return slices.Clone(e.procs)
	}
	return nil
}

// Saturate holds a running execution's memory at its limit: from now on
// its memory stall total grows with the clock (every task stalled all the
// time), until KillLargestProcess kills a process or Relieve. It reports
// false when id does not run.
func (d *Driver) Saturate(id string) bool {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e := d.m.running(id)
	if e == nil {
		return false
	}
	if e.saturatedFrom.IsZero() {
		e.saturatedFrom = time.Now()
	}
	return true
}

// Relieve ends the saturation of Saturate: the stall total stops growing.
func (d *Driver) Relieve(id string) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if e := d.m.execs[id]; e != nil {
		e.relieve(time.Now())
	}
}

// relieve stops the growth of the stall total at now; mu is held.
func (e *execution) relieve(now time.Time) {
	if !e.saturatedFrom.IsZero() {
		e.stalled += now.Sub(e.saturatedFrom)
		e.saturatedFrom = time.Time{}
	}
}

// WithoutPressure makes CheckGuest of a running execution report no
// memory pressure, as on a kernel that does not account it; it reports
// false when id does not run.
func (d *Driver) WithoutPressure(id string) bool {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e := d.m.running(id)
	if e == nil {
		return false
	}
	e.noPressure = true
	return true
}

// IgnoreTerm makes the guest of id ignore a NORMAL stop's request to end:
// the stop waits out its grace (or until its context ends) before it
// ends the execution.
func (d *Driver) IgnoreTerm(id string) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.ignoreTerm[id] = true
}

// SetStopOutcome makes the next Stop of id return res and err; with a nil
// err the execution is released as usual.
func (d *Driver) SetStopOutcome(id string, res runtime.StopResult, err error) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.stops[id] = stopOutcome{res, err}
}

// SetMetrics makes Metrics of a running execution return m, or err when
// it is not nil, until it stops; it reports false when id does not run.
func (d *Driver) SetMetrics(id string, m runtime.Metrics, err error) bool {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e := d.m.execs[id]
	if e == nil || !e.running() {
		return false
	}
	e.metrics = &metricsOutcome{m, err}
	return true
}

// ServeDataPlane makes h the data plane of every running guest: DialGuest
// of guestabi.DataSocket connects to it over cleartext HTTP/2. Without it,
// a guest serves no socket.
func (d *Driver) ServeDataPlane(h http.Handler) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.dataPlane = h
}

// LimitDataPlaneStreams makes each data socket's HTTP/2 connection allow
// n streams at once, as a guest may.
func (d *Driver) LimitDataPlaneStreams(n int) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.dataStreams = n
}

// SlowDataPlaneDials makes each dial of a data socket take d, as a
// guest's may under load.
func (d *Driver) SlowDataPlaneDials(dur time.Duration) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.dataDialTime = dur
}

// DataPlaneDials returns how many data sockets were dialed.
func (d *Driver) DataPlaneDials() int {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.m.dataDials
}

// Exit ends the init of a running execution on its own, as if it had
// exited with st; Wait and Status then see it. It reports false when id
// does not run.
func (d *Driver) Exit(id string, st runtime.Status) bool {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e := d.m.execs[id]
	if e == nil || !e.running() {
		return false
	}
	st.Running, st.Ready = false, false
	st.OOMKills = max(st.OOMKills, e.oomKills)
	st.OOMKilled = st.OOMKilled || st.OOMKills > 0
	e.status = st
	close(e.ended)
	return true
}

// Spec returns the spec a running execution was started with, and its
// current memory limit.
func (d *Driver) Spec(id string) (spec runtime.Spec, memory uint64, ok bool) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e := d.m.execs[id]
	if e == nil {
		return runtime.Spec{}, 0, false
	}
	return e.spec, e.memory, true
}

// Starts returns how many times id started, over the machine's life.
func (d *Driver) Starts(id string) int {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.m.starts[id]
}

// IDs returns the executions the machine holds, running or ended but not
// released, sorted.
func (d *Driver) IDs() []string {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	ids := make([]string, 0, len(d.m.execs))
	for id := range d.m.execs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// InUse reports whether an execution holds the image at path.
func (d *Driver) InUse(path string) bool {
	abs, _ := filepath.Abs(path)
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	_, ok := d.m.inUse[abs]
	return ok
}

// Start starts an execution; see runtime.Driver. Like the OCI driver, it
// refuses an ID that runs, images in use by another execution, and a
// volume path the platform mounts itself; leftovers of an ended
// execution of the same ID are released first.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) error {
	if err := checkSpec(spec); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	images := []string{spec.LayerImage}
	if spec.Volume != nil {
		images = append(images, spec.Volume.Image)
	}
	for i, img := range images {
		abs, err := filepath.Abs(img)
		if err != nil {
			return err
		}
		images[i] = abs
	}
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if err, ok := m.failStart[spec.ID]; ok {
		delete(m.failStart, spec.ID)
		return err
	}
	if e := m.execs[spec.ID]; e != nil {
		if e.running() {
			return fmt.Errorf("fake: execution %s exists (running)", spec.ID)
		}
		m.release(spec.ID)
	}
	for _, img := range images {
		if holder, ok := m.inUse[img]; ok {
			return fmt.Errorf("fake: image %s is in use by %s", img, holder)
		}
	}
	for _, img := range images {
		m.inUse[img] = spec.ID
	}
	m.execs[spec.ID] = &execution{spec: spec, images: images, memory: spec.MemoryBytes, ended: make(chan struct{})}
	if m.holdReady {
		m.neverReady[spec.ID] = true
	}
	m.starts[spec.ID]++
	return nil
}

// checkSpec rejects what the OCI driver rejects before it sets anything
// up, but for the files it would run (layers, guest agent).
func checkSpec(spec runtime.Spec) error {
	if !validID(spec.ID) {
		return fmt.Errorf("fake: invalid execution id %q", spec.ID)
	}
	if len(spec.Layers) == 0 {
		return errors.New("fake: an execution needs at least one layer")
	}
	layer, err := os.Stat(spec.LayerImage)
	if err != nil || !layer.Mode().IsRegular() {
		return fmt.Errorf("fake: layer image %q is not a regular file", spec.LayerImage)
	}
	if v := spec.Volume; v != nil {
		fi, err := os.Stat(v.Image)
		if err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("fake: volume image %q is not a regular file", v.Image)
		}
		if os.SameFile(fi, layer) {
			return fmt.Errorf("fake: volume image %q is the layer image", v.Image)
		}
		if err := guestabi.CheckVolumePath(v.Path); err != nil {
			return fmt.Errorf("fake: %w", err)
		}
	}
	if !filepath.IsAbs(spec.GuestAgent) {
		return fmt.Errorf("fake: guest agent path %q must be absolute", spec.GuestAgent)
	}
	return nil
}

// validID is the ID rule of runtime.Spec.
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// release forgets an execution and frees its images; mu is held.
func (m *machine) release(id string) {
	e := m.execs[id]
	if e == nil {
		return
	}
	for _, img := range e.images {
		delete(m.inUse, img)
	}
	delete(m.execs, id)
	delete(m.neverReady, id)
}

// get returns the execution id; mu is held.
func (m *machine) get(id string) (*execution, error) {
	e := m.execs[id]
	if e == nil {
		return nil, runtime.ErrNotFound
	}
	return e, nil
}

// Probe answers nil for a running execution unless it was made
// NeverReady; see runtime.Driver.
func (d *Driver) Probe(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e, err := d.m.get(id)
	switch {
	case err != nil:
		return err
	case !e.running():
		return fmt.Errorf("fake: the guest agent of %s has ended", id)
	case d.m.neverReady[id]:
		return ErrNeverReady
	}
	return nil
}

// CheckGuest probes like Probe, after a wait for a hung ID (HangChecks),
// and reads the execution's OOM kill count (see OOMKill) and memory
// pressure (see Saturate); the boot ID is the execution's start count.
// See runtime.Driver.
func (d *Driver) CheckGuest(ctx context.Context, id string) (runtime.GuestCheck, error) {
	d.m.mu.Lock()
	hung := d.m.hung[id]
	if hung != nil {
		d.m.hanging[id]++
	}
	d.m.mu.Unlock()
	if hung != nil {
		select {
		case <-hung:
		case <-ctx.Done():
		}
		d.m.mu.Lock()
		d.m.hanging[id]--
		d.m.mu.Unlock()
	}
	err := d.Probe(ctx, id)
	if errors.Is(err, runtime.ErrNotFound) {
		return runtime.GuestCheck{}, err
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	c := runtime.GuestCheck{ProbeErr: err}
	if e := d.m.execs[id]; e != nil {
		c.OOMKills = e.oomKills
		c.MemoryPressure = e.memoryPressure(time.Now())
	}
	if err == nil {
		c.BootID = fmt.Sprint(d.m.starts[id])
	}
	return c, nil
}

// KillLargestProcess removes the process of SetProcesses that
// runtime.LargestProcess chooses and ends a saturation (the memory it
// held is free); see runtime.Driver.
func (d *Driver) KillLargestProcess(ctx context.Context, id string) (runtime.GuestProcess, error) {
	if err := ctx.Err(); err != nil {
		return runtime.GuestProcess{}, err
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e, err := d.m.get(id)
	if err != nil {
		return runtime.GuestProcess{}, err
	}
	if !e.running() {
		return runtime.GuestProcess{}, fmt.Errorf("fake: execution %s does not run", id)
	}
	p, ok := runtime.LargestProcess(e.procs)
	if !ok {
		return runtime.GuestProcess{}, runtime.ErrNoProcess
	}
	e.procs = slices.DeleteFunc(e.procs, func(q runtime.GuestProcess) bool { return q.PID == p.PID })
	e.relieve(time.Now())
	return p, nil
}

// Status observes an execution; see runtime.Driver.
func (d *Driver) Status(ctx context.Context, id string) (runtime.Status, error) {
	if err := ctx.Err(); err != nil {
		return runtime.Status{}, err
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.m.status(id)
}

// status observes id; mu is held.
func (m *machine) status(id string) (runtime.Status, error) {
	e, err := m.get(id)
	if err != nil {
		return runtime.Status{}, err
	}
	if !e.running() {
		return e.status, nil
	}
	return runtime.Status{Running: true, Ready: !m.neverReady[id], OOMKilled: e.oomKills > 0, OOMKills: e.oomKills}, nil
}

// Wait blocks until the execution's init ends or ctx ends; see
// runtime.Driver.
func (d *Driver) Wait(ctx context.Context, id string) (runtime.Status, error) {
	d.m.mu.Lock()
	e, err := d.m.get(id)
	d.m.mu.Unlock()
	if err != nil {
		return runtime.Status{}, err
	}
	select {
	case <-ctx.Done():
		return runtime.Status{}, ctx.Err()
	case <-e.ended:
	}
	return d.Status(ctx, id)
}

// Stop ends and releases an execution; see runtime.Driver. A NORMAL stop
// is confirmed, a FORCE stop is not, unless SetStopOutcome says
// otherwise; an unknown execution stops unconfirmed.
func (d *Driver) Stop(ctx context.Context, id string, mode runtime.StopMode, grace time.Duration) (runtime.StopResult, error) {
	if !validID(id) {
		return runtime.StopResult{}, fmt.Errorf("fake: invalid execution id %q", id)
	}
	if err := ctx.Err(); err != nil {
		return runtime.StopResult{}, err
	}
	m := d.m
	m.mu.Lock()
	if e := m.execs[id]; mode == runtime.StopNormal && e != nil && e.running() && m.ignoreTerm[id] {
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return runtime.StopResult{}, ctx.Err()
		case <-time.After(grace):
		}
		m.mu.Lock()
	}
	defer m.mu.Unlock()
	e := m.execs[id]
	res := runtime.StopResult{Confirmed: e != nil && mode == runtime.StopNormal}
	if o, ok := m.stops[id]; ok {
		delete(m.stops, id)
		if o.err != nil {
			return o.res, o.err
		}
		res = o.res
	}
	if e != nil && e.running() {
		e.status = runtime.Status{ExitCode: 137, Signal: "KILL"}
		if mode == runtime.StopNormal {
			e.status = runtime.Status{}
		}
		close(e.ended)
	}
	m.release(id)
	return res, nil
}

// SetMemory changes a running execution's memory limit; see
// runtime.Driver.
func (d *Driver) SetMemory(ctx context.Context, id string, bytes uint64) error {
	return d.updateRunning(ctx, id, func(e *execution) { e.memory = bytes })
}

// SetCPU changes a running execution's CPU limit, which Spec then
// reports; see runtime.Driver.
func (d *Driver) SetCPU(ctx context.Context, id string, millis uint32) error {
	return d.updateRunning(ctx, id, func(e *execution) { e.spec.CPUMillis = millis })
}

// updateRunning applies change to the record of a running execution.
func (d *Driver) updateRunning(ctx context.Context, id string, change func(*execution)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e, err := d.m.get(id)
	if err != nil {
		return err
	}
	if !e.running() {
		return fmt.Errorf("fake: execution %s does not run", id)
	}
	change(e)
	return nil
}

// VolumeUsage returns no bytes used of a capacity of the volume image's
// size; see runtime.Driver.
func (d *Driver) VolumeUsage(ctx context.Context, id string) (used, capacity uint64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	d.m.mu.Lock()
	e, err := d.m.get(id)
	d.m.mu.Unlock()
	if err != nil {
		return 0, 0, err
	}
	if e.spec.Volume == nil {
		return 0, 0, fmt.Errorf("%w: execution %s has no volume", runtime.ErrNotFound, id)
	}
	capacity, err = imageSize(e.spec.Volume.Image)
	return 0, capacity, err
}

// Metrics returns what SetMetrics set, else figures of an idle guest: one
// process, nothing used, the memory limit in force and the images' sizes
// as capacities; see runtime.Driver.
func (d *Driver) Metrics(ctx context.Context, id string) (runtime.Metrics, error) {
	if err := ctx.Err(); err != nil {
		return runtime.Metrics{}, err
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	e, err := d.m.get(id)
	switch {
	case err != nil:
		return runtime.Metrics{}, err
	case !e.running():
		return runtime.Metrics{}, fmt.Errorf("%w: execution %s does not run", runtime.ErrNotFound, id)
	case e.metrics != nil:
		return e.metrics.m, e.metrics.err
	}
	m := runtime.Metrics{MemoryLimitBytes: e.memory, Processes: 1}
	if m.LayerCapacityBytes, err = imageSize(e.spec.LayerImage); err != nil {
		return runtime.Metrics{}, err
	}
	if v := e.spec.Volume; v != nil {
		if m.VolumeCapacityBytes, err = imageSize(v.Image); err != nil {
			return runtime.Metrics{}, err
		}
	}
	return m, nil
}

func imageSize(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return uint64(fi.Size()), nil
}

// DialGuest connects to a socket of a running guest: only
// guestabi.DataSocket, served by the handler of ServeDataPlane; see
// runtime.Driver.
func (d *Driver) DialGuest(ctx context.Context, id, name string) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.m.mu.Lock()
	e, err := d.m.get(id)
	h, streams, dialTime := d.m.dataPlane, d.m.dataStreams, d.m.dataDialTime
	if err == nil && e.running() && name == guestabi.DataSocket && h != nil {
		d.m.dataDials++
	}
	d.m.mu.Unlock()
	if dialTime > 0 {
		select {
		case <-time.After(dialTime):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	switch {
	case err != nil:
		return nil, err
	case !e.running():
		return nil, fmt.Errorf("fake: the guest of %s has ended", id)
	case name != guestabi.DataSocket || h == nil:
		return nil, fmt.Errorf("fake: the guest of %s serves no socket %q", id, name)
	}
	return serveConn(h, streams, e.ended), nil
}

// Recover releases the executions whose init has ended and returns those
// still running; see runtime.Driver.
func (d *Driver) Recover(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	var running []string
	var errs []error
	for id, e := range d.m.execs {
		switch err := d.m.failRecover[id]; {
		case err != nil:
			errs = append(errs, err)
		case e.running() || e.status.Shutdown:
			running = append(running, id)
		default:
			d.m.release(id)
		}
	}
	slices.Sort(running)
	return running, errors.Join(errs...)
}
