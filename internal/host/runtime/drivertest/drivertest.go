// Package drivertest is the one test suite every runtime.Driver passes:
// the fake, the OCI driver with each runtime the machine runs, and any
// later driver. It checks what the Driver interface promises, and where
// its doc is silent, what the OCI driver does and callers rely on (errors
// for unknown executions, a second Stop, refused specs leaving nothing).
package drivertest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// Machine is one test's host as the suite sees it.
type Machine interface {
	// Driver returns a new driver object over the machine's state, as a
	// restarted host agent would have it.
	Driver(t *testing.T) runtime.Driver
	// Spec returns a runnable spec of execution id with a new layer image
	// of its own.
	Spec(t *testing.T, id string) runtime.Spec
	// Volume returns a new volume image.
	Volume(t *testing.T, name string) string
	// Crash ends the init of a running execution behind the driver's back
	// and returns once it has ended.
	Crash(t *testing.T, id string)
	// EndGuest makes the guest of a running execution end its machine as
	// its own init does when asked from inside (guestabi: a reset, or with
	// shutdown a shutdown) and returns once init has ended.
	EndGuest(t *testing.T, id string, shutdown bool)
	// Hog starts a process in a running execution's guest that holds at
	// least bytes of memory until it is killed, and returns it (its PID and
	// command) once it holds them.
	Hog(t *testing.T, id string, bytes uint64) runtime.GuestProcess
	// AssertReleased fails t if anything of the execution of spec is still
	// held on the machine, its layer and volume images included.
	AssertReleased(t *testing.T, spec runtime.Spec)
	// CPULimit returns the CPU limit in force for a running execution, in
	// thousandths of a core (0: none), as the machine enforces it.
	CPULimit(t *testing.T, id string) uint32
}

// bound is how long one step of a test may take before it is reported
// as hung (a bound, not a measure: a loaded machine stays far below it).
const bound = time.Minute

// Run runs the suite; newMachine is called once per test.
func Run(t *testing.T, newMachine func(t *testing.T) Machine) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, Machine)
	}{
		{"StartProbeStopNormal", testStartProbeStopNormal},
		{"StopForce", testStopForce},
		{"Unknown", testUnknown},
		{"RefusedSpecs", testRefusedSpecs},
		{"CancelledStart", testCancelledStart},
		{"StartTwice", testStartTwice},
		{"LayerInUse", testLayerInUse},
		{"InitEnds", testInitEnds},
		{"GuestEnds", testGuestEnds},
		{"WaitHonoursContext", testWaitHonoursContext},
		{"RecoverAfterRestart", testRecoverAfterRestart},
		{"SetMemory", testSetMemory},
		{"SetCPU", testSetCPU},
		{"Volume", testVolume},
		{"Metrics", testMetrics},
		{"DialGuest", testDialGuest},
		{"KillLargestProcess", testKillLargestProcess},
		{"Concurrent", testConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, newMachine(t)) })
	}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

// running starts an execution of the spec named name on a new driver.
func running(t *testing.T, m Machine, name string) (runtime.Driver, runtime.Spec) {
	t.Helper()
	d := m.Driver(t)
	spec := m.Spec(t, name)
	start(t, d, spec)
	return d, spec
}

// start starts spec and waits until its guest answers the probe.
func start(t *testing.T, d runtime.Driver, spec runtime.Spec) {
	t.Helper()
	ctx := ctxOf(t)
	if err := d.Start(ctx, spec); err != nil {
		t.Fatalf("Start(%s): %v", spec.ID, err)
	}
	waitReady(t, d, spec.ID)
}

func waitReady(t *testing.T, d runtime.Driver, id string) {
	t.Helper()
	ctx := ctxOf(t)
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := d.Probe(pctx, id)
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s not ready within %s: %v", id, bound, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop stops id in mode, checks that it is released, and returns the
// result.
func stop(t *testing.T, m Machine, d runtime.Driver, spec runtime.Spec, mode runtime.StopMode) runtime.StopResult {
	t.Helper()
	res, err := d.Stop(ctxOf(t), spec.ID, mode, time.Second)
	if err != nil {
		t.Fatalf("Stop(%s): %v", spec.ID, err)
	}
	m.AssertReleased(t, spec)
	return res
}

// wantAnswers checks that the execution id still answers its probe after
// what the test did to it or beside it.
func wantAnswers(t *testing.T, d runtime.Driver, id, after string) {
	t.Helper()
	if err := d.Probe(ctxOf(t), id); err != nil {
		t.Errorf("Probe(%s) %s: %v", id, after, err)
	}
}

// wantGone checks that the driver no longer knows id.
func wantGone(t *testing.T, d runtime.Driver, id string) {
	t.Helper()
	ctx := ctxOf(t)
	if _, err := d.Status(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Status(%s): %v, want ErrNotFound", id, err)
	}
	if err := d.Probe(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Probe(%s): %v, want ErrNotFound", id, err)
	}
	if _, err := d.CheckGuest(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("CheckGuest(%s): %v, want ErrNotFound", id, err)
	}
	if _, err := d.Metrics(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Metrics(%s): %v, want ErrNotFound", id, err)
	}
	if p, err := d.KillLargestProcess(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("KillLargestProcess(%s) = %+v, %v; want ErrNotFound", id, p, err)
	}
}

// testStartProbeStopNormal: a started execution runs and becomes ready; a
// NORMAL stop is confirmed and releases it; a second stop succeeds with
// nothing to confirm.
func testStartProbeStopNormal(t *testing.T, m Machine) {
	d, spec := running(t, m, "normal")
	st, err := d.Status(ctxOf(t), spec.ID)
	if err != nil || !st.Running || !st.Ready || st.OOMKilled {
		t.Errorf("Status of a ready execution = %+v, %v", st, err)
	}
	c, err := d.CheckGuest(ctxOf(t), spec.ID)
	if err != nil || c.ProbeErr != nil || c.BootID == "" || c.OOMKills != 0 {
		t.Errorf("CheckGuest of a ready execution = %+v, %v", c, err)
	}
	if p := c.MemoryPressure; p != nil && p.Full.Total > p.Some.Total {
		t.Errorf("memory pressure of a ready execution: full stall %s exceeds some %s", p.Full.Total, p.Some.Total)
	}
	if res := stop(t, m, d, spec, runtime.StopNormal); !res.Confirmed {
		t.Error("NORMAL stop not confirmed")
	}
	wantGone(t, d, spec.ID)
	if res, err := d.Stop(ctxOf(t), spec.ID, runtime.StopNormal, time.Second); err != nil || res.Confirmed {
		t.Errorf("second Stop = %+v, %v; want success, unconfirmed", res, err)
	}
	// The layer image outlives the execution: the next start reuses it.
	start(t, d, spec)
	stop(t, m, d, spec, runtime.StopNormal)
}

// testStopForce: a FORCE stop is never confirmed and releases everything;
// the layer image starts again.
func testStopForce(t *testing.T, m Machine) {
	d, spec := running(t, m, "force")
	if res := stop(t, m, d, spec, runtime.StopForce); res.Confirmed {
		t.Error("FORCE stop confirmed")
	}
	wantGone(t, d, spec.ID)
	start(t, d, spec)
	stop(t, m, d, spec, runtime.StopForce)
}

// testUnknown: an execution the driver does not know is ErrNotFound where
// the interface says so, an error elsewhere, and stops successfully.
func testUnknown(t *testing.T, m Machine) {
	d := m.Driver(t)
	ctx := ctxOf(t)
	wantGone(t, d, "unknown")
	if _, err := d.Wait(ctx, "unknown"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Wait: %v, want ErrNotFound", err)
	}
	if _, _, err := d.VolumeUsage(ctx, "unknown"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("VolumeUsage: %v, want ErrNotFound", err)
	}
	if res, err := d.Stop(ctx, "unknown", runtime.StopNormal, time.Second); err != nil || res.Confirmed {
		t.Errorf("Stop = %+v, %v; want success, unconfirmed", res, err)
	}
	if err := d.SetMemory(ctx, "unknown", 256<<20); err == nil {
		t.Error("SetMemory of an unknown execution succeeded")
	}
	if err := d.SetCPU(ctx, "unknown", 500); err == nil {
		t.Error("SetCPU of an unknown execution succeeded")
	}
	if c, err := d.DialGuest(ctx, "unknown", guestabi.DataSocket); err == nil {
		c.Close()
		t.Error("DialGuest of an unknown execution succeeded")
	}
}

// testRefusedSpecs: a spec the driver cannot run is refused before
// anything is set up.
func testRefusedSpecs(t *testing.T, m Machine) {
	d := m.Driver(t)
	ctx := ctxOf(t)
	vol := m.Volume(t, "v")
	for _, c := range []struct {
		name   string
		change func(*runtime.Spec)
	}{
		{"no layers", func(s *runtime.Spec) { s.Layers = nil }},
		{"missing layer image", func(s *runtime.Spec) { s.LayerImage += ".missing" }},
		{"relative guest agent", func(s *runtime.Spec) { s.GuestAgent = "kibotos-guest" }},
		{"relative volume path", func(s *runtime.Spec) { s.Volume = &runtime.VolumeMount{Image: vol, Path: "data"} }},
		{"volume at /", func(s *runtime.Spec) { s.Volume = &runtime.VolumeMount{Image: vol, Path: "/"} }},
		{"volume over the sockets", func(s *runtime.Spec) { s.Volume = &runtime.VolumeMount{Image: vol, Path: guestabi.SocketDir} }},
		{"volume is the layer", func(s *runtime.Spec) { s.Volume = &runtime.VolumeMount{Image: s.LayerImage, Path: "/data"} }},
		{"missing volume image", func(s *runtime.Spec) { s.Volume = &runtime.VolumeMount{Image: vol + ".missing", Path: "/data"} }},
	} {
		spec := m.Spec(t, "refused")
		c.change(&spec)
		if err := d.Start(ctx, spec); err == nil {
			d.Stop(ctx, spec.ID, runtime.StopForce, 0)
			t.Errorf("%s: Start succeeded", c.name)
		}
		wantGone(t, d, spec.ID)
		m.AssertReleased(t, spec)
	}
	for _, id := range []string{"", "Bad", "a/b", "..", strings.Repeat("a", 65)} {
		spec := m.Spec(t, "valid")
		spec.ID = id
		if err := d.Start(ctx, spec); err == nil {
			d.Stop(ctx, id, runtime.StopForce, 0)
			t.Errorf("Start accepted the ID %q", id)
		}
	}
}

// testCancelledStart: a start whose context has ended fails and leaves
// nothing.
func testCancelledStart(t *testing.T, m Machine) {
	d := m.Driver(t)
	spec := m.Spec(t, "cancelled")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Start(ctx, spec); err == nil {
		t.Fatal("Start with an ended context succeeded")
	}
	wantGone(t, d, spec.ID)
	m.AssertReleased(t, spec)
}

// testStartTwice: a running ID cannot be started again, and the running
// execution does not suffer.
func testStartTwice(t *testing.T, m Machine) {
	d, spec := running(t, m, "twice")
	again := m.Spec(t, "twice")
	if err := d.Start(ctxOf(t), again); err == nil {
		t.Error("started a running execution again")
	}
	wantAnswers(t, d, spec.ID, "after a second Start")
	stop(t, m, d, spec, runtime.StopNormal)
	m.AssertReleased(t, again)
}

// testLayerInUse: a second execution on a layer image in use is refused
// and leaves nothing; the first runs on.
func testLayerInUse(t *testing.T, m Machine) {
	d := m.Driver(t)
	one := m.Spec(t, "one")
	start(t, d, one)
	two := m.Spec(t, "two")
	two.LayerImage = one.LayerImage
	if err := d.Start(ctxOf(t), two); err == nil {
		t.Error("started a second execution on a layer image in use")
	}
	wantGone(t, d, two.ID)
	wantAnswers(t, d, one.ID, "after a second Start on its layer image")
	stop(t, m, d, one, runtime.StopNormal)
	// Free once its execution stopped.
	start(t, d, two)
	stop(t, m, d, two, runtime.StopForce)
}

// testInitEnds: Wait returns when init ends on its own; the driver then
// reports it ended and its guest unanswering, and Stop, or the next Start
// of the ID, releases it; the guest of that start answers the probe.
func testInitEnds(t *testing.T, m Machine) {
	d, spec := running(t, m, "ends")
	// A probe before the end: what a driver keeps of it (a connection to
	// the agent) must not answer for the guest once it has ended.
	c, err := d.CheckGuest(ctxOf(t), spec.ID)
	if err != nil || c.ProbeErr != nil {
		t.Fatalf("CheckGuest of a ready execution = %+v, %v", c, err)
	}
	booted := c.BootID
	type result struct {
		st  runtime.Status
		err error
	}
	waited := make(chan result, 1)
	go func() {
		st, err := d.Wait(ctxOf(t), spec.ID)
		waited <- result{st, err}
	}()
	m.Crash(t, spec.ID)
	r := <-waited
	if r.err != nil || r.st.Running || r.st.Ready || r.st.Shutdown {
		t.Errorf("Wait = %+v, %v; want an ended execution, not shut down", r.st, r.err)
	}
	ctx := ctxOf(t)
	if st, err := d.Status(ctx, spec.ID); err != nil || st.Running || st.Ready {
		t.Errorf("Status after the end = %+v, %v", st, err)
	}
	if err := d.Probe(ctx, spec.ID); err == nil {
		t.Error("Probe of an ended execution succeeded")
	}
	if c, err := d.CheckGuest(ctx, spec.ID); err != nil || c.ProbeErr == nil {
		t.Errorf("CheckGuest of an ended execution = %+v, %v; want a probe error", c, err)
	}
	// Wait sees init end as it exits; its cgroup may list it a moment
	// longer, until it is reaped.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m, err := d.Metrics(ctx, spec.ID)
		if errors.Is(err, runtime.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("Metrics of an ended execution = %+v, %v; want ErrNotFound", m, err)
			break
		}
	}
	if st, err := d.Wait(ctx, spec.ID); err != nil || st.Running {
		t.Errorf("Wait of an ended execution = %+v, %v", st, err)
	}
	stop(t, m, d, spec, runtime.StopNormal)
	wantGone(t, d, spec.ID)

	// A start over the leftovers of an ended execution releases them
	// first.
	start(t, d, spec)
	m.Crash(t, spec.ID)
	start(t, d, spec)
	if c, err := d.CheckGuest(ctx, spec.ID); err != nil || c.ProbeErr != nil || c.BootID == booted {
		t.Errorf("CheckGuest of the started again execution = %+v, %v; want an answer from a new boot (not %q)", c, err, booted)
	}
	stop(t, m, d, spec, runtime.StopForce)
}

// testGuestEnds: a guest that resets or shuts down its machine ends init,
// and Wait and Status tell which; the same spec starts again over the
// ended execution once it is stopped (as a host bringing back a guest
// that reset does), and nothing of either run is left.
func testGuestEnds(t *testing.T, m Machine) {
	d := m.Driver(t)
	spec := m.Spec(t, "guestends")
	for _, shutdown := range []bool{false, true} {
		start(t, d, spec)
		waited := make(chan runtime.Status, 1)
		go func() {
			st, err := d.Wait(ctxOf(t), spec.ID)
			if err != nil {
				t.Errorf("Wait: %v", err)
			}
			waited <- st
		}()
		m.EndGuest(t, spec.ID, shutdown)
		if st := <-waited; st.Running || st.Shutdown != shutdown {
			t.Errorf("Wait after the guest ended (shutdown %v) = %+v", shutdown, st)
		}
		if st, err := d.Status(ctxOf(t), spec.ID); err != nil || st.Running || st.Shutdown != shutdown {
			t.Errorf("Status after the guest ended (shutdown %v) = %+v, %v", shutdown, st, err)
		}
		stop(t, m, d, spec, runtime.StopNormal)
		wantGone(t, d, spec.ID)
	}
}

// testWaitHonoursContext: Wait of a running execution returns the
// context's error when it ends first.
func testWaitHonoursContext(t *testing.T, m Machine) {
	d, spec := running(t, m, "waitctx")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Wait(ctx, spec.ID); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with an ended context: %v, want context.Canceled", err)
	}
	wantAnswers(t, d, spec.ID, "after Wait with an ended context")
	stop(t, m, d, spec, runtime.StopForce)
}

// testRecoverAfterRestart: a new driver object over the same machine
// adopts what runs (and can probe, stop and wait on it), releases what
// ended while nobody watched, its volume included, and keeps one whose
// guest shut down meanwhile, for the caller to see the shutdown.
func testRecoverAfterRestart(t *testing.T, m Machine) {
	d := m.Driver(t)
	alive, dead, off := m.Spec(t, "alive"), m.Spec(t, "dead"), m.Spec(t, "off")
	dead.Volume = &runtime.VolumeMount{Image: m.Volume(t, "dead"), Path: "/srv/data"}
	start(t, d, alive)
	start(t, d, dead)
	start(t, d, off)
	m.Crash(t, dead.ID)
	m.EndGuest(t, off.ID, true)

	d2 := m.Driver(t)
	ctx := ctxOf(t)
	ids, err := d2.Recover(ctx)
	if err != nil || !slices.Equal(ids, []string{alive.ID, off.ID}) {
		t.Fatalf("Recover = %v, %v; want [%s %s]", ids, err, alive.ID, off.ID)
	}
	m.AssertReleased(t, dead)
	wantGone(t, d2, dead.ID)
	if st, err := d2.Wait(ctx, off.ID); err != nil || st.Running || !st.Shutdown {
		t.Errorf("Wait of the guest that shut down meanwhile = %+v, %v", st, err)
	}
	stop(t, m, d2, off, runtime.StopNormal)
	wantGone(t, d2, off.ID)
	if st, err := d2.Status(ctx, alive.ID); err != nil || !st.Running || !st.Ready {
		t.Errorf("Status after Recover = %+v, %v", st, err)
	}
	// Recover again finds the same; nothing changes.
	if ids, err := d2.Recover(ctx); err != nil || len(ids) != 1 || ids[0] != alive.ID {
		t.Errorf("second Recover = %v, %v", ids, err)
	}
	if err := d2.SetMemory(ctx, alive.ID, 512<<20); err != nil {
		t.Errorf("SetMemory after Recover: %v", err)
	}
	if res := stop(t, m, d2, alive, runtime.StopNormal); !res.Confirmed {
		t.Error("NORMAL stop of an adopted execution not confirmed")
	}
	if ids, err := d2.Recover(ctx); err != nil || len(ids) != 0 {
		t.Errorf("Recover with nothing left = %v, %v", ids, err)
	}
}

// testSetMemory: a running execution's memory limit changes at once.
func testSetMemory(t *testing.T, m Machine) {
	d, spec := running(t, m, "memory")
	if err := d.SetMemory(ctxOf(t), spec.ID, spec.MemoryBytes+128<<20); err != nil {
		t.Errorf("SetMemory: %v", err)
	}
	wantAnswers(t, d, spec.ID, "after SetMemory")
	stop(t, m, d, spec, runtime.StopNormal)
}

// testSetCPU: an execution started without a CPU limit takes one at
// once, and gives it up again.
func testSetCPU(t *testing.T, m Machine) {
	d := m.Driver(t)
	ctx := ctxOf(t)
	spec := m.Spec(t, "cpu")
	spec.CPUMillis = 0
	start(t, d, spec)
	if got := m.CPULimit(t, spec.ID); got != 0 {
		t.Errorf("started without a CPU limit, it has %d millicores", got)
	}
	for _, millis := range []uint32{250, 0} {
		if err := d.SetCPU(ctx, spec.ID, millis); err != nil {
			t.Fatalf("SetCPU(%d): %v", millis, err)
		}
		if got := m.CPULimit(t, spec.ID); got != millis {
			t.Errorf("after SetCPU(%d) the limit is %d millicores", millis, got)
		}
	}
	wantAnswers(t, d, spec.ID, "after SetCPU")
	stop(t, m, d, spec, runtime.StopNormal)
}

// testVolume: an execution's volume is measured while it runs, refused
// to a second execution, and free again after a stop.
func testVolume(t *testing.T, m Machine) {
	d := m.Driver(t)
	ctx := ctxOf(t)
	vol := m.Volume(t, "v")
	withVolume := func(id string) runtime.Spec {
		s := m.Spec(t, id)
		s.Volume = &runtime.VolumeMount{Image: vol, Path: "/data"}
		return s
	}
	first := withVolume("v1")
	start(t, d, first)
	used, capacity, err := d.VolumeUsage(ctx, first.ID)
	if err != nil || capacity == 0 || used > capacity {
		t.Errorf("VolumeUsage = %d of %d, %v", used, capacity, err)
	}
	second := withVolume("v2")
	if err := d.Start(ctx, second); err == nil {
		t.Error("started a second execution on a volume in use")
	}
	wantGone(t, d, second.ID)
	wantAnswers(t, d, first.ID, "after a second Start on its volume")
	if res := stop(t, m, d, first, runtime.StopNormal); !res.Confirmed {
		t.Error("NORMAL stop with a volume not confirmed")
	}
	if _, _, err := d.VolumeUsage(ctx, first.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("VolumeUsage after the stop: %v, want ErrNotFound", err)
	}
	start(t, d, second)
	if res := stop(t, m, d, second, runtime.StopForce); res.Confirmed {
		t.Error("FORCE stop with a volume confirmed")
	}

	plain := m.Spec(t, "novol")
	start(t, d, plain)
	if _, _, err := d.VolumeUsage(ctx, plain.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("VolumeUsage of an execution without a volume: %v, want ErrNotFound", err)
	}
	stop(t, m, d, plain, runtime.StopForce)
}

// testMetrics: a running execution's figures are consistent with its
// spec: its memory limit (and the one SetMemory sets), at least one
// process, filesystems no larger than their images, the volume's as
// VolumeUsage measures it, no volume figures without one, and a CPU time
// that never goes back.
func testMetrics(t *testing.T, m Machine) {
	d := m.Driver(t)
	ctx := ctxOf(t)
	spec := m.Spec(t, "metrics")
	vol := m.Volume(t, "v")
	spec.Volume = &runtime.VolumeMount{Image: vol, Path: "/data"}
	start(t, d, spec)
	first, err := d.Metrics(ctx, spec.ID)
	if err != nil {
		t.Fatalf("Metrics: %v", err)
	}
	if first.MemoryLimitBytes != spec.MemoryBytes || first.Processes < 1 {
		t.Errorf("Metrics = %+v; want the limit %d and a process", first, spec.MemoryBytes)
	}
	if first.MemoryBytes > first.MemoryLimitBytes || first.MemorySomeAvg10 < 0 || first.MemoryFullAvg10 > first.MemorySomeAvg10 {
		t.Errorf("memory figures of %+v are inconsistent", first)
	}
	within := func(what string, used, capacity uint64, image string) {
		t.Helper()
		fi, err := os.Stat(image)
		if err != nil {
			t.Fatal(err)
		}
		if capacity == 0 || used > capacity || capacity > uint64(fi.Size()) {
			t.Errorf("%s: %d used of %d, on an image of %d bytes", what, used, capacity, fi.Size())
		}
	}
	within("writable layer", first.LayerUsedBytes, first.LayerCapacityBytes, spec.LayerImage)
	within("volume", first.VolumeUsedBytes, first.VolumeCapacityBytes, vol)
	used, capacity, err := d.VolumeUsage(ctx, spec.ID)
	if err != nil || used != first.VolumeUsedBytes || capacity != first.VolumeCapacityBytes {
		t.Errorf("VolumeUsage = %d of %d, %v; Metrics said %d of %d", used, capacity, err, first.VolumeUsedBytes, first.VolumeCapacityBytes)
	}
	raised := spec.MemoryBytes + 128<<20
	if err := d.SetMemory(ctx, spec.ID, raised); err != nil {
		t.Fatal(err)
	}
	second, err := d.Metrics(ctx, spec.ID)
	if err != nil || second.MemoryLimitBytes != raised || second.CPU < first.CPU {
		t.Errorf("after SetMemory: %+v, %v; want the limit %d and a CPU time from %s up", second, err, raised, first.CPU)
	}
	stop(t, m, d, spec, runtime.StopNormal)

	plain := m.Spec(t, "metrics-novol")
	start(t, d, plain)
	if got, err := d.Metrics(ctx, plain.ID); err != nil || got.VolumeUsedBytes != 0 || got.VolumeCapacityBytes != 0 || got.LayerCapacityBytes == 0 {
		t.Errorf("Metrics without a volume = %+v, %v", got, err)
	}
	stop(t, m, d, plain, runtime.StopForce)
}

// testDialGuest: the guest's data socket carries HTTP/2 to its data
// plane while the execution runs; bad names, and stopped executions, are
// refused.
func testDialGuest(t *testing.T, m Machine) {
	d := m.Driver(t)
	ctx := ctxOf(t)
	spec := m.Spec(t, "dial")
	start(t, d, spec)
	// The guest agent may open its data socket after it answers the probe.
	var c net.Conn
	for {
		var err error
		if c, err = d.DialGuest(ctx, spec.ID, guestabi.DataSocket); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("DialGuest(%s): %v", guestabi.DataSocket, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if status, err := roundTrip(ctx, c); err != nil || status == 0 {
		t.Errorf("an HTTP/2 request to the data plane: status %d, %v", status, err)
	}
	for _, name := range []string{"", ".", "..", "../" + guestabi.DataSocket, "a/b", "missing.sock"} {
		if c, err := d.DialGuest(ctx, spec.ID, name); err == nil {
			c.Close()
			t.Errorf("DialGuest accepted the name %q", name)
		}
	}
	stop(t, m, d, spec, runtime.StopNormal)
	if c, err := d.DialGuest(ctx, spec.ID, guestabi.DataSocket); err == nil {
		c.Close()
		t.Error("DialGuest of a stopped execution succeeded")
	}
}

// roundTrip sends one cleartext HTTP/2 request over c and returns the
// response's status.
func roundTrip(ctx context.Context, c net.Conn) (int, error) {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	used := false
	tr := &http.Transport{Protocols: &p, DialContext: func(context.Context, string, string) (net.Conn, error) {
		if used {
			return nil, errors.New("one connection only")
		}
		used = true
		return c, nil
	}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://guest/kibotos.data.v1.Unknown/Call", nil)
	if err != nil {
		return 0, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// testConcurrent: executions start, run and stop side by side.
func testConcurrent(t *testing.T, m Machine) {
	d := m.Driver(t)
	specs := []runtime.Spec{m.Spec(t, "c0"), m.Spec(t, "c1"), m.Spec(t, "c2")}
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Go(func() {
			ctx := ctxOf(t)
			if errs[i] = d.Start(ctx, spec); errs[i] != nil {
				return
			}
			for d.Probe(ctx, spec.ID) != nil {
				if errs[i] = ctx.Err(); errs[i] != nil {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			res, err := d.Stop(ctx, spec.ID, runtime.StopNormal, time.Second)
			if errs[i] = err; err == nil && !res.Confirmed {
				errs[i] = errors.New("NORMAL stop not confirmed")
			}
		})
	}
	wg.Wait()
	for i, spec := range specs {
		if errs[i] != nil {
			t.Errorf("%s: %v", spec.ID, errs[i])
		}
		m.AssertReleased(t, spec)
	}
}

// testKillLargestProcess: with only the guest agent running there is
// nothing to kill; of two processes the one with the larger resident set
// is killed first and described; the guest agent survives every kill.
func testKillLargestProcess(t *testing.T, m Machine) {
	d, spec := running(t, m, "kill")
	ctx := ctxOf(t)
	p, err := d.KillLargestProcess(ctx, spec.ID)
	if errors.Is(err, errors.ErrUnsupported) {
		stop(t, m, d, spec, runtime.StopNormal)
		t.Skipf("the driver does not see the guest's processes: %v", err)
	}
	if !errors.Is(err, runtime.ErrNoProcess) {
		t.Errorf("KillLargestProcess with only the guest agent = %+v, %v; want ErrNoProcess", p, err)
	}
	small := m.Hog(t, spec.ID, 4<<20)
	large := m.Hog(t, spec.ID, 16<<20)
	for _, want := range []struct {
		p     runtime.GuestProcess
		bytes uint64
	}{{large, 16 << 20}, {small, 4 << 20}} {
		p, err := d.KillLargestProcess(ctx, spec.ID)
		if err != nil || p.PID != want.p.PID || p.Command != want.p.Command || p.RSSBytes < want.bytes {
			t.Errorf("KillLargestProcess = %+v, %v; want %+v holding at least %d bytes", p, err, want.p, want.bytes)
		}
		wantAnswers(t, d, spec.ID, "after a kill")
	}
	if p, err := d.KillLargestProcess(ctx, spec.ID); !errors.Is(err, runtime.ErrNoProcess) {
		t.Errorf("KillLargestProcess after both kills = %+v, %v; want ErrNoProcess", p, err)
	}
	stop(t, m, d, spec, runtime.StopNormal)
}
