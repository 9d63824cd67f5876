package fake_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/host/runtime/drivertest"
	"github.com/kibotos/kibotos/internal/host/runtime/fake"
)

// machine is the suite's view of a fake machine.
type machine struct {
	d    *fake.Driver
	dir  string
	next int
}

func newMachine(t *testing.T) drivertest.Machine {
	d := fake.New()
	d.ServeDataPlane(http.NotFoundHandler())
	return &machine{d: d, dir: t.TempDir()}
}

func (m *machine) Driver(*testing.T) runtime.Driver { return m.d.Restart() }

func (m *machine) Spec(t *testing.T, id string) runtime.Spec {
	m.next++
	img := filepath.Join(m.dir, fmt.Sprintf("%s-%d.img", id, m.next))
	if err := m.d.CreateLayer(context.Background(), img, 64<<20); err != nil {
		t.Fatal(err)
	}
	return runtime.Spec{ID: id, Layers: []string{"/layers/base"}, LayerImage: img, CPUMillis: 1000,
		MemoryBytes: 256 << 20, PidsLimit: 256, GuestAgent: "/bin/kibotos-guest", Hostname: id}
}

func (m *machine) Volume(t *testing.T, name string) string {
	img := filepath.Join(m.dir, "volumes", name+".img")
	if err := fake.Image(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	return img
}

func (m *machine) Crash(t *testing.T, id string) {
	if !m.d.Exit(id, runtime.Status{ExitCode: 137, Signal: "KILL"}) {
		t.Fatalf("Crash: %s does not run", id)
	}
}

func (m *machine) EndGuest(t *testing.T, id string, shutdown bool) {
	if !m.d.Exit(id, runtime.Status{ExitCode: -1, Shutdown: shutdown}) {
		t.Fatalf("EndGuest: %s does not run", id)
	}
}

// Hog adds a process to the guest's processes.
func (m *machine) Hog(t *testing.T, id string, bytes uint64) runtime.GuestProcess {
	m.next++
	p := runtime.GuestProcess{PID: int32(100 + m.next), Command: "hog", RSSBytes: bytes}
	if !m.d.SetProcesses(id, append(m.d.Processes(id), p)) {
		t.Fatalf("Hog: %s does not run", id)
	}
	return p
}

func (m *machine) CPULimit(t *testing.T, id string) uint32 {
	spec, _, ok := m.d.Spec(id)
	if !ok {
		t.Fatalf("CPULimit: %s does not run", id)
	}
	return spec.CPUMillis
}

func (m *machine) AssertReleased(t *testing.T, spec runtime.Spec) {
	t.Helper()
	if slices.Contains(m.d.IDs(), spec.ID) {
		t.Errorf("%s is still held", spec.ID)
	}
	if m.d.InUse(spec.LayerImage) {
		t.Errorf("the layer image of %s is still in use", spec.ID)
	}
	if spec.Volume != nil && m.d.InUse(spec.Volume.Image) {
		t.Errorf("the volume image of %s is still in use", spec.ID)
	}
}

func TestDriverSuite(t *testing.T) { drivertest.Run(t, newMachine) }

// TestFaults: each knob does what it says, once where it says once.
func TestFaults(t *testing.T) {
	m := newMachine(t).(*machine)
	d, ctx := m.d, context.Background()
	spec := m.Spec(t, "x")

	refused := errors.New("refused")
	d.FailStart("x", refused)
	if err := d.Start(ctx, spec); !errors.Is(err, refused) {
		t.Fatalf("Start with FailStart: %v", err)
	}
	m.AssertReleased(t, spec)

	d.NeverReady("x")
	if err := d.Start(ctx, spec); err != nil {
		t.Fatalf("the next Start: %v", err)
	}
	if err := d.Probe(ctx, "x"); !errors.Is(err, fake.ErrNeverReady) {
		t.Errorf("Probe of a NeverReady guest: %v", err)
	}
	if st, _ := d.Status(ctx, "x"); !st.Running || st.Ready {
		t.Errorf("Status of a NeverReady guest: %+v", st)
	}

	d.SetStopOutcome("x", runtime.StopResult{}, nil)
	if res, err := d.Stop(ctx, "x", runtime.StopNormal, 0); err != nil || res.Confirmed {
		t.Errorf("Stop with an unconfirmed outcome = %+v, %v", res, err)
	}
	m.AssertReleased(t, spec)

	if err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Probe(ctx, "x"); err != nil {
		t.Errorf("NeverReady outlived its execution: %v", err)
	}
	d.SetStopOutcome("x", runtime.StopResult{}, refused)
	if _, err := d.Stop(ctx, "x", runtime.StopNormal, 0); !errors.Is(err, refused) {
		t.Errorf("Stop with a failing outcome: %v", err)
	}
	if st, err := d.Status(ctx, "x"); err != nil || !st.Running {
		t.Errorf("a failed Stop ended the execution: %+v, %v", st, err)
	}
	if _, memory, ok := d.Spec("x"); !ok || memory != 256<<20 {
		t.Errorf("Spec: memory %d, %v", memory, ok)
	}
	if res, err := d.Stop(ctx, "x", runtime.StopNormal, 0); err != nil || !res.Confirmed {
		t.Errorf("the next Stop = %+v, %v", res, err)
	}
}

// TestMemoryKnobs: Saturate makes the memory stall total grow until
// Relieve or a kill, and WithoutPressure hides it.
func TestMemoryKnobs(t *testing.T) {
	m := newMachine(t).(*machine)
	d, ctx := m.d, context.Background()
	if d.Saturate("x") || d.SetProcesses("x", nil) || d.WithoutPressure("x") {
		t.Error("a knob took an execution that does not run")
	}
	if err := d.Start(ctx, m.Spec(t, "x")); err != nil {
		t.Fatal(err)
	}
	full := func() time.Duration {
		t.Helper()
		c, err := d.CheckGuest(ctx, "x")
		if err != nil || c.MemoryPressure == nil || c.MemoryPressure.Some != c.MemoryPressure.Full {
			t.Fatalf("CheckGuest = %+v, %v", c, err)
		}
		return c.MemoryPressure.Full.Total
	}
	if got := full(); got != 0 {
		t.Errorf("stall before Saturate: %s", got)
	}
	d.Saturate("x")
	time.Sleep(time.Millisecond)
	d.Relieve("x")
	relieved := full()
	if relieved < time.Millisecond || full() != relieved {
		t.Errorf("stall after a saturated millisecond: %s, then %s", relieved, full())
	}

	d.SetProcesses("x", []runtime.GuestProcess{{PID: 1, Command: "kibotos-guest", RSSBytes: 1 << 30}, {PID: 7, Command: "sh", RSSBytes: 1 << 20}})
	d.Saturate("x")
	time.Sleep(time.Millisecond)
	if p, err := d.KillLargestProcess(ctx, "x"); err != nil || p.PID != 7 {
		t.Errorf("KillLargestProcess = %+v, %v", p, err)
	}
	killed := full()
	if killed < relieved+time.Millisecond || full() != killed {
		t.Errorf("stall after a kill: %s, then %s", killed, full())
	}
	if procs := d.Processes("x"); len(procs) != 1 || procs[0].PID != 1 {
		t.Errorf("processes after the kill: %+v", procs)
	}

	d.WithoutPressure("x")
	if c, err := d.CheckGuest(ctx, "x"); err != nil || c.MemoryPressure != nil {
		t.Errorf("CheckGuest WithoutPressure = %+v, %v", c, err)
	}
}
