package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/host/diskimage"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/host/runtime/drivertest"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestDriverSuite runs the shared driver suite against the OCI driver
// with each runtime this machine has.
func TestDriverSuite(t *testing.T) {
	for _, name := range []string{Runc, Crun, Runsc} {
		t.Run(name, func(t *testing.T) {
			hosttest.RequireRoot(t)
			hosttest.RequireBusybox(t)
			if _, err := diskimage.LookPath(name); err != nil {
				t.Skipf("%s is not installed (Debian package %s; scripts/install-deps installs runc and runsc)", name, name)
			}
			drivertest.Run(t, func(t *testing.T) drivertest.Machine { return newSuiteMachine(t, name) })
		})
	}
}

// suiteMachine is the suite's view of this host: a state directory the
// driver objects share, the template's layers, and the images.
type suiteMachine struct {
	runtime string
	state   string
	layers  []string
	d       *Driver // the latest driver object
	next    int
}

func newSuiteMachine(t *testing.T, name string) *suiteMachine {
	dir := t.TempDir()
	m := &suiteMachine{runtime: name, state: filepath.Join(dir, "runtime"), layers: []string{hosttest.BusyboxRoot(t), topLayer(t)}}
	m.Driver(t)
	// Whatever a failed test left: force-stop every execution of the
	// state directory before it goes (cleanups run last-in first-out).
	t.Cleanup(func() { forceStopAll(t, m.d) })
	return m
}

func (m *suiteMachine) Driver(t *testing.T) runtime.Driver {
	d, err := New(Config{StateDir: m.state, Runtime: m.runtime})
	if err != nil {
		t.Fatal(err)
	}
	m.d = d
	return d
}

func (m *suiteMachine) Spec(t *testing.T, id string) runtime.Spec {
	m.next++
	img := filepath.Join(filepath.Dir(m.state), "layers", fmt.Sprintf("%s-%d.img", id, m.next))
	if err := m.d.CreateLayer(context.Background(), img, 64<<20); err != nil {
		t.Fatal(err)
	}
	return runtime.Spec{ID: id, Layers: m.layers, LayerImage: img, CPUMillis: 1000, MemoryBytes: 256 << 20,
		PidsLimit: 256, GuestAgent: guestAgent, Hostname: "ws-" + id}
}

func (m *suiteMachine) Volume(t *testing.T, name string) string {
	img := filepath.Join(filepath.Dir(m.state), "volumes", name+".img")
	if err := diskimage.Create(context.Background(), img, 64<<20, ""); err != nil {
		t.Fatal(err)
	}
	return img
}

// Crash kills the container's init with the runtime itself and waits
// until it has ended.
func (m *suiteMachine) Crash(t *testing.T, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.d.kill(ctx, id, "KILL"); err != nil {
		t.Fatalf("kill %s: %v", id, err)
	}
	if err := m.d.waitStopped(ctx, id); err != nil {
		t.Fatalf("waiting for %s to end: %v", id, err)
	}
}

// EndGuest signals the guest agent as busybox's reboot (SIGTERM) or
// poweroff (SIGUSR2) does from inside the guest, and waits until init has
// ended.
func (m *suiteMachine) EndGuest(t *testing.T, id string, shutdown bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signal := "TERM"
	if shutdown {
		signal = "USR2"
	}
	if err := m.d.kill(ctx, id, signal); err != nil {
		t.Fatalf("kill %s %s: %v", signal, id, err)
	}
	if err := m.d.waitStopped(ctx, id); err != nil {
		t.Fatalf("waiting for %s to end: %v", id, err)
	}
}

// AssertReleased checks that nothing of the execution is left: container,
// mounts, loop devices of its images, cgroups, directory.
func (m *suiteMachine) AssertReleased(t *testing.T, spec runtime.Spec) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if validID(spec.ID) {
		if _, err := m.d.state(ctx, spec.ID); !errors.Is(err, errNoContainer) {
			t.Errorf("the container of %s is left: %v", spec.ID, err)
		}
		if pts, err := mountsUnder(m.d.dir(spec.ID)); err != nil || len(pts) > 0 {
			t.Errorf("still mounted for %s: %v %v", spec.ID, pts, err)
		}
		if dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", cgroupPath(spec.ID))); len(dirs) > 0 {
			t.Errorf("cgroups left: %v", dirs)
		}
		if _, err := os.Stat(m.d.dir(spec.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the directory of %s is left: %v", spec.ID, err)
		}
	}
	assertNotAttached(t, spec.LayerImage)
	if spec.Volume != nil {
		assertNotAttached(t, spec.Volume.Image)
	}
}

// CPULimit reads the CFS quota of the execution's cgroup: cgroup v1's
// cpu.cfs_quota_us, else cgroup2's cpu.max.
func (m *suiteMachine) CPULimit(t *testing.T, id string) uint32 {
	t.Helper()
	cg := cgroupPath(id)
	quota, period := "", int64(cfsPeriod)
	if b, err := os.ReadFile(filepath.Join(cgroupRoot, "cpu", cg, "cpu.cfs_quota_us")); err == nil {
		quota = strings.TrimSpace(string(b))
	} else if b, err := os.ReadFile(filepath.Join(cgroupRoot, cg, "cpu.max")); err == nil {
		q, p, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		if period, err = strconv.ParseInt(p, 10, 64); err != nil {
			t.Fatalf("cpu.max of %s: %q", id, b)
		}
		quota = q
	} else {
		t.Fatalf("no CPU controller file of %s: %v", id, err)
	}
	if quota == "-1" || quota == "max" {
		return 0
	}
	q, err := strconv.ParseInt(quota, 10, 64)
	if err != nil {
		t.Fatalf("the CFS quota of %s: %q", id, quota)
	}
	return uint32(q * 1000 / period)
}

// Hog runs a shell in the guest that fills a variable with bytes and then
// blocks opening a fifo nobody writes; the shell that starts it returns
// the hog's PID once the variable is full (or fails once the hog ended).
func (m *suiteMachine) Hog(t *testing.T, id string, bytes uint64) runtime.GuestProcess {
	m.next++
	h := fmt.Sprintf("/tmp/hog%d", m.next)
	hog := fmt.Sprintf(`x=$(head -c %d /dev/zero | tr '\0' x); touch %s.held; read y <%[2]s`, bytes, h)
	launch := fmt.Sprintf(`mkfifo %[1]s || exit 1
sh -c "$1" </dev/null >/dev/null 2>&1 & hog=$!
while [ ! -e %[1]s.held ]; do kill -0 $hog || exit 1; sleep 0.05; done; echo $hog`, h)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := m.d.Exec(ctx, id, "sh", "-c", launch, "sh", hog)
	if err != nil {
		t.Fatalf("Hog: %v", err)
	}
	pid, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 32)
	if err != nil {
		t.Fatalf("Hog: %q: %v", out, err)
	}
	return runtime.GuestProcess{PID: int32(pid), Command: "sh"}
}
