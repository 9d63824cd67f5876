package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/diskimage"
	"github.com/kibotos/kibotos/internal/host/mountinfo"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// guestAgent is the kibotos-guest binary TestMain builds.
var guestAgent string

func TestMain(m *testing.M) { testutil.RunWithGuestAgent(m, &guestAgent) }

// env is one test's driver over its own state directory.
type env struct {
	d      *Driver
	state  string
	layers []string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	hosttest.RequireContainers(t)
	state := t.TempDir()
	d, err := New(Config{StateDir: filepath.Join(state, "runtime")})
	if err != nil {
		t.Fatal(err)
	}
	// Whatever a failed test left goes before the temp dir (cleanups run
	// last-in first-out).
	t.Cleanup(func() { forceStopAll(t, d) })
	return &env{d: d, state: state, layers: []string{hosttest.BusyboxRoot(t), topLayer(t)}}
}

// forceStopAll force-stops every execution of the driver's state directory.
func forceStopAll(t testing.TB, d *Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids, _ := d.knownIDs()
	listed, _ := d.list(ctx)
	for _, id := range append(ids, listed...) {
		if _, err := d.Stop(ctx, id, runtime.StopForce, 0); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// topLayer overrides /etc/motd of the base layer.
func topLayer(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "top")
	writeFile(t, filepath.Join(root, "etc", "motd"), "top\n")
	return root
}

func writeFile(t testing.TB, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// image creates a writable-layer image of 64 MiB.
func (e *env) image(t testing.TB) string {
	t.Helper()
	return e.namedImage(t, "ws.img")
}

// namedImage creates a writable-layer image of 64 MiB named name.
func (e *env) namedImage(t testing.TB, name string) string {
	t.Helper()
	img := filepath.Join(e.state, "layers", name)
	if err := e.d.CreateLayer(context.Background(), img, 64<<20); err != nil {
		t.Fatal(err)
	}
	return img
}

func (e *env) spec(id, image string) runtime.Spec {
	return runtime.Spec{
		ID:          id,
		Layers:      e.layers,
		LayerImage:  image,
		CPUMillis:   1000,
		MemoryBytes: 256 << 20,
		PidsLimit:   256,
		GuestAgent:  guestAgent,
		Hostname:    "ws-" + id,
		Env:         []string{"KIBOTOS_TEST=1"},
	}
}

// start starts spec, waits until the agent is ready and returns the time
// that took. Cleanup force-stops it and checks that nothing is left.
func (e *env) start(t testing.TB, spec runtime.Spec) time.Duration {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := e.d.Stop(ctx, spec.ID, runtime.StopForce, 0); err != nil {
			t.Errorf("cleanup stop: %v", err)
		}
		e.assertReleased(t, spec.ID, spec.LayerImage)
		if spec.Volume != nil {
			assertNotAttached(t, spec.Volume.Image)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := e.d.Start(ctx, spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	waitReady(t, e.d, spec.ID)
	return time.Since(t0)
}

func waitReady(t testing.TB, d *Driver, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := d.Probe(ctx, id)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(consoleLog(d.dir(id)))
			t.Fatalf("not ready within 10 s: %v\nconsole: %s", err, log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *env) exec(t testing.TB, id string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.d.Exec(ctx, id, args...)
	if err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	return string(out)
}

// assertReleased checks that nothing of execution id is left on the host:
// container, mounts under the state dir, loop device, cgroups.
func (e *env) assertReleased(t testing.TB, id, image string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ids, err := e.d.list(ctx); err != nil || len(ids) > 0 {
		t.Errorf("runc list: %v %v", ids, err)
	}
	if err := mountinfo.Scan(func(line []byte) {
		if mp, ok := mountinfo.MountPoint(line); ok && strings.HasPrefix(mountinfo.Unescape(string(mp)), e.state) {
			t.Errorf("still mounted: %s", mp)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if image != "" {
		assertNotAttached(t, image)
	}
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/kibotos/" + id); len(dirs) > 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
	if _, err := os.Stat(e.d.dir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("execution directory left: %v", err)
	}
}

// assertNotAttached checks that no loop device is bound to image.
func assertNotAttached(t testing.TB, image string) {
	t.Helper()
	abs, _ := filepath.Abs(image)
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), abs) {
			t.Errorf("loop device still bound to %s: %s", image, f)
		}
	}
}

func TestLayers(t *testing.T) {
	hosttest.RequireContainers(t)
	d, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	img := filepath.Join(t.TempDir(), "sub", "l.img")
	if err := d.CreateLayer(ctx, img, 64<<20+1); err == nil {
		t.Fatal("CreateLayer accepted a size that is not whole MiB")
	}
	if err := d.CreateLayer(ctx, img, 0); err == nil {
		t.Fatal("CreateLayer accepted 0 bytes")
	}
	if err := d.CreateLayer(ctx, img, 32<<20); err != nil {
		t.Fatal(err)
	}
	if n, err := d.LayerCapacity(img); err != nil || n != 32<<20 {
		t.Fatalf("LayerCapacity = %d, %v", n, err)
	}
	// An existing image is kept as it is.
	if err := d.CreateLayer(ctx, img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if n, _ := d.LayerCapacity(img); n != 32<<20 {
		t.Fatalf("existing image changed to %d bytes", n)
	}
	if out, err := exec.Command("dumpe2fs", "-h", img).CombinedOutput(); err == nil && !strings.Contains(string(out), "has_journal") {
		t.Errorf("image has no journal:\n%s", out)
	}
	if err := d.DeleteLayer(img); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteLayer(img); err != nil {
		t.Fatalf("deleting a missing image: %v", err)
	}
	if _, err := d.LayerCapacity(img); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LayerCapacity of a deleted image: %v", err)
	}
	if names := Detect(); len(names) == 0 || names[0] != Runc {
		t.Errorf("Detect() = %v, want runc first", names)
	}
}

// TestPersistence: a file written into the rootfs survives a normal stop
// and the next start on the same image; /tmp does not.
func TestPersistence(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	spec := e.spec("persist", img)
	took := e.start(t, spec)
	t.Logf("start → ready: %v", took)

	if got := e.exec(t, "persist", "cat", "/etc/motd"); got != "top\n" {
		t.Errorf("/etc/motd = %q, want the top layer's", got)
	}
	if got := e.exec(t, "persist", "hostname"); got != "ws-persist\n" {
		t.Errorf("hostname = %q", got)
	}
	if got := e.exec(t, "persist", "sh", "-c", "echo $KIBOTOS_TEST; cat /proc/1/cmdline"); !strings.HasPrefix(got, "1\n/.kibotos/guest") {
		t.Errorf("env and PID 1: %q", got)
	}
	e.exec(t, "persist", "sh", "-c", "echo kept > /root/kept.txt && echo gone > /tmp/gone.txt")
	// A process that ignores SIGTERM: the agent kills it after the grace.
	e.exec(t, "persist", "sh", "-c", "trap '' TERM; sleep 1000 >/dev/null 2>&1 </dev/null &")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	res, err := e.d.Stop(ctx, "persist", runtime.StopNormal, 300*time.Millisecond)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !res.Confirmed {
		t.Error("normal stop not confirmed")
	}
	t.Logf("normal stop: %v", time.Since(t0))
	e.assertReleased(t, "persist", img)
	if _, err := e.d.Status(ctx, "persist"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Status after stop: %v, want ErrNotFound", err)
	}
	// Stopping again succeeds.
	if _, err := e.d.Stop(ctx, "persist", runtime.StopNormal, time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}

	e.start(t, spec)
	if got := e.exec(t, "persist", "cat", "/root/kept.txt"); got != "kept\n" {
		t.Errorf("/root/kept.txt after restart = %q", got)
	}
	if out, err := e.d.Exec(ctx, "persist", "ls", "/tmp/gone.txt"); err == nil {
		t.Errorf("/tmp/gone.txt survived the restart: %s", out)
	}
	st, err := e.d.Status(ctx, "persist")
	if err != nil || !st.Running || !st.Ready || st.OOMKilled {
		t.Errorf("Status = %+v, %v", st, err)
	}
}

// wantOOMKilled runs args in the execution id and wants the kernel to kill
// them past the memory limit (exit 137) while the execution runs on and
// reports OOMKilled.
func (e *env) wantOOMKilled(ctx context.Context, t *testing.T, id string, args ...string) {
	t.Helper()
	_, err := e.d.Exec(ctx, id, args...)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 137 {
		t.Fatalf("%s: %v, want it killed (exit 137)", strings.Join(args, " "), err)
	}
	st, err := e.d.Status(ctx, id)
	if err != nil || !st.OOMKilled || !st.Running || !st.Ready {
		t.Fatalf("Status after the OOM kill = %+v, %v", st, err)
	}
}

// TestMemoryLimit: a process that allocates past the limit is killed;
// the execution runs on and reports OOMKilled.
func TestMemoryLimit(t *testing.T) {
	e := newEnv(t)
	spec := e.spec("oom", e.image(t))
	spec.MemoryBytes = 128 << 20
	e.start(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st, err := e.d.Status(ctx, "oom"); err != nil || st.OOMKilled {
		t.Fatalf("Status before = %+v, %v", st, err)
	}
	e.wantOOMKilled(ctx, t, "oom", "dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1")
	if err := e.d.Probe(ctx, "oom"); err != nil {
		t.Fatalf("Probe after OOM: %v", err)
	}
}

// TestForceStop: a forced stop is unconfirmed and releases everything.
func TestForceStop(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	e.start(t, e.spec("force", img))
	e.exec(t, "force", "sh", "-c", "echo x > /root/x")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.d.Stop(ctx, "force", runtime.StopForce, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Confirmed {
		t.Error("forced stop confirmed")
	}
	e.assertReleased(t, "force", img)
	if res, err := e.d.Stop(ctx, "unknown", runtime.StopNormal, time.Second); err != nil || res.Confirmed {
		t.Errorf("stopping an unknown execution: %+v, %v", res, err)
	}
	if _, err := e.d.Status(ctx, "unknown"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Status of unknown: %v", err)
	}
	// The journal makes the image mountable again after the forced stop.
	e.start(t, e.spec("force", img))
	if got := e.exec(t, "force", "cat", "/root/x"); got != "x\n" {
		t.Errorf("/root/x after a forced stop = %q", got)
	}
}

// TestStopOfABrokenFilesystem: a NORMAL stop of an execution whose layer
// filesystem aborted its journal (as a full host disk makes it) releases
// everything and is unconfirmed, not failed; the next start mounts the
// image again.
func TestStopOfABrokenFilesystem(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	e.start(t, e.spec("broken", img))
	layer := filepath.Join(e.d.dir("broken"), "layer")
	if out, err := exec.Command("mount", "-o", "remount,abort", layer).CombinedOutput(); err != nil {
		t.Fatalf("aborting the layer's journal: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.d.Stop(ctx, "broken", runtime.StopNormal, time.Second)
	if err != nil || res.Confirmed {
		t.Fatalf("normal stop of a broken filesystem: %+v, %v; want it unconfirmed", res, err)
	}
	e.assertReleased(t, "broken", img)
	e.start(t, e.spec("broken", img))
}

// TestRecover: a new driver on the same state adopts a running execution,
// and releases one that died while nobody watched.
func TestRecover(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	e.start(t, e.spec("rec", img))

	d2, err := New(Config{StateDir: e.d.stateDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := d2.Recover(ctx)
	if err != nil || len(ids) != 1 || ids[0] != "rec" {
		t.Fatalf("Recover = %v, %v; want [rec]", ids, err)
	}
	if err := d2.Probe(ctx, "rec"); err != nil {
		t.Fatalf("Probe after Recover: %v", err)
	}

	// Kill it behind the driver's back.
	if out, err := exec.Command("runc", "--root", d2.rootDir, "kill", "rec", "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v %s", err, out)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	st, err := d2.Wait(wctx, "rec")
	wcancel()
	if err != nil || st.Running || st.ExitCode != -1 {
		t.Fatalf("Wait = %+v, %v", st, err)
	}
	ids, err = d2.Recover(ctx)
	if err != nil || len(ids) != 0 {
		t.Fatalf("Recover after the kill = %v, %v; want none", ids, err)
	}
	e.d = d2
	e.assertReleased(t, "rec", img)
}

// TestZombiesReaped: orphans inherited by the agent are reaped.
func TestZombiesReaped(t *testing.T) {
	e := newEnv(t)
	e.start(t, e.spec("zomb", e.image(t)))
	e.exec(t, "zomb", "sh", "-c", "for i in 1 2 3 4 5; do sleep 0.1 & done; exec true")
	var out string
	for range 20 {
		time.Sleep(100 * time.Millisecond)
		out = e.exec(t, "zomb", "sh", "-c", "cat /proc/[0-9]*/stat")
		if !strings.Contains(out, "(sleep)") && !strings.Contains(out, ") Z ") {
			return
		}
	}
	t.Fatalf("zombies or orphans remain after 2 s:\n%s", out)
}

// TestRecoverPartialStart: the leftovers of a start that crashed after
// mounting (record, loop device, mounts, no container) are released by
// Recover and by the next Start.
func TestRecoverPartialStart(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	crashAfterMount := func() {
		t.Helper()
		rec := &record{
			ID: "part", Runtime: e.d.name, LayerImage: img, Layers: e.layers,
			LayerMount: filepath.Join(e.d.dir("part"), "layer"),
			RootfsPath: filepath.Join(e.d.dir("part"), "rootfs"),
		}
		if err := os.MkdirAll(e.d.dir("part"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := e.d.writeRecord(rec); err != nil {
			t.Fatal(err)
		}
		if err := e.d.mountLayers(rec); err != nil {
			t.Fatal(err)
		}
		if len(diskimage.LoopsOf(img)) != 1 {
			t.Fatal("layer not attached")
		}
	}
	crashAfterMount()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := e.d.Recover(ctx)
	if err != nil || len(ids) != 0 {
		t.Fatalf("Recover = %v, %v; want none", ids, err)
	}
	e.assertReleased(t, "part", img)

	crashAfterMount()
	e.start(t, e.spec("part", img))
}

// TestLayerInUse: an image attached to a running execution can neither
// be started again nor deleted; a running ID cannot be started twice.
func TestLayerInUse(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	e.start(t, e.spec("one", img))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.d.Start(ctx, e.spec("two", img)); err == nil {
		t.Fatal("started a second execution on an image in use")
	}
	if _, err := os.Stat(e.d.dir("two")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed start left its directory: %v", err)
	}
	if err := e.d.Start(ctx, e.spec("one", img)); err == nil {
		t.Fatal("started a running execution again")
	}
	if err := e.d.DeleteLayer(img); err == nil {
		t.Fatal("deleted an image in use")
	}
	if err := e.d.Probe(ctx, "one"); err != nil {
		t.Fatalf("the running execution suffered: %v", err)
	}
}

// TestConcurrentStarts: executions start and stop side by side.
func TestConcurrentStarts(t *testing.T) {
	e := newEnv(t)
	const n = 4
	errc := make(chan error, n)
	for i := range n {
		id := "c" + string(rune('0'+i))
		img := filepath.Join(e.state, "layers", id+".img")
		if err := e.d.CreateLayer(context.Background(), img, 32<<20); err != nil {
			t.Fatal(err)
		}
		spec := e.spec(id, img)
		t.Cleanup(func() {
			e.d.Stop(context.Background(), id, runtime.StopForce, 0)
			e.assertReleased(t, id, img)
		})
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := e.d.Start(ctx, spec); err != nil {
				errc <- err
				return
			}
			for e.d.Probe(ctx, id) != nil {
				if ctx.Err() != nil {
					errc <- ctx.Err()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			res, err := e.d.Stop(ctx, id, runtime.StopNormal, time.Second)
			if err == nil && !res.Confirmed {
				err = errors.New("stop of " + id + " not confirmed")
			}
			errc <- err
		}()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

// BenchmarkStartReady measures Start until the guest agent answers
// (ns/op includes the normal stop after it; start-ready-ms does not).
func BenchmarkStartReady(b *testing.B) {
	e := newEnv(b)
	img := e.image(b)
	spec := e.spec("bench", img)
	var ready time.Duration
	for b.Loop() {
		ready += e.start(b, spec)
		res, err := e.d.Stop(context.Background(), "bench", runtime.StopNormal, time.Second)
		if err != nil || !res.Confirmed {
			b.Fatalf("Stop = %+v, %v", res, err)
		}
	}
	b.ReportMetric(float64(ready.Milliseconds())/float64(b.N), "start-ready-ms")
}

// TestStartFails: a start that fails (cancelled, bad agent) leaves nothing.
func TestStartFails(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.d.Start(ctx, e.spec("cancelled", img)); err == nil {
		t.Fatal("Start with a cancelled context succeeded")
	}
	e.assertReleased(t, "cancelled", img)

	notExec := filepath.Join(t.TempDir(), "agent")
	writeFile(t, notExec, "#!/bin/sh\n")
	bad := e.spec("badagent", img)
	bad.GuestAgent = notExec
	if err := e.d.Start(context.Background(), bad); err == nil {
		t.Fatal("Start with a non-executable agent succeeded")
	}
	e.assertReleased(t, "badagent", img)

	// An agent that cannot run: init dies at once; Wait sees it, Stop
	// releases it.
	os.Chmod(notExec, 0o755)
	writeFile(t, notExec, "not a program")
	t.Cleanup(func() {
		e.d.Stop(context.Background(), "badagent", runtime.StopForce, 0)
		e.assertReleased(t, "badagent", img)
	})
	if err := e.d.Start(context.Background(), bad); err == nil {
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := e.d.Wait(wctx, "badagent")
		wcancel()
		if err != nil || st.Running || st.Ready || st.ExitCode != -1 {
			t.Errorf("Wait = %+v, %v", st, err)
		}
		if err := e.d.Probe(context.Background(), "badagent"); err == nil {
			t.Error("Probe of a dead agent succeeded")
		}
	}
	if _, err := e.d.Stop(context.Background(), "badagent", runtime.StopNormal, time.Second); err != nil {
		t.Fatal(err)
	}
	e.assertReleased(t, "badagent", img)

	bad = e.spec("Bad/ID", img)
	if err := e.d.Start(context.Background(), bad); err == nil {
		t.Fatal("Start accepted an invalid ID")
	}
}

// TestGuestSocketDirectory: the guest cannot make the host follow a link
// it plants among its sockets, nor fill the host's disk through them.
func TestGuestSocketDirectory(t *testing.T) {
	e := newEnv(t)
	e.start(t, e.spec("socks", e.image(t)))
	e.exec(t, "socks", "ln", "-s", "/run/kibotos/agent.sock", "/run/kibotos/evil.sock")
	if c, err := e.d.DialGuest(context.Background(), "socks", "evil.sock"); err == nil {
		c.Close()
		t.Error("DialGuest followed a symlink the guest planted")
	}
	c, err := e.d.DialGuest(context.Background(), "socks", "agent.sock")
	if err != nil {
		t.Fatalf("DialGuest of the real socket: %v", err)
	}
	c.Close()
	out := e.exec(t, "socks", "sh", "-c", "dd if=/dev/zero of=/run/kibotos/fill bs=1M count=8 2>&1; echo rc=$?")
	if !strings.Contains(out, "rc=1") {
		t.Errorf("writing 8 MiB into the socket directory: %q; want it refused", out)
	}
}

// TestSeccomp: the guest cannot make a user namespace or reach the kernel
// keyring, and ordinary work still runs.
func TestSeccomp(t *testing.T) {
	e := newEnv(t)
	e.start(t, e.spec("sec", e.image(t)))
	if out := e.exec(t, "sec", "sh", "-c", "unshare -U true 2>&1; echo rc=$?"); !strings.Contains(out, "rc=1") {
		t.Errorf("unshare -U in the guest: %q; want it refused", out)
	}
	if out := e.exec(t, "sec", "sh", "-c", "echo hi | cat; sleep 0.01 & wait; echo ok"); !strings.Contains(out, "hi") || !strings.Contains(out, "ok") {
		t.Errorf("ordinary work under the profile: %q", out)
	}
}

// volume creates a volume image of 64 MiB.
func (e *env) volume(t testing.TB, name string) string {
	t.Helper()
	img := filepath.Join(e.state, "volumes", name+".img")
	if err := diskimage.Create(context.Background(), img, 64<<20, ""); err != nil {
		t.Fatal(err)
	}
	return img
}

// stop stops id in mode and checks that it was released and the volume
// image is free.
func (e *env) stop(t testing.TB, spec runtime.Spec, mode runtime.StopMode) runtime.StopResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.d.Stop(ctx, spec.ID, mode, time.Second)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	e.assertReleased(t, spec.ID, spec.LayerImage)
	if spec.Volume != nil {
		assertNotAttached(t, spec.Volume.Image)
	}
	return res
}

// TestVolume: a volume keeps its data across executions (on other layer
// images) after normal and forced stops, is full at its own capacity
// without harm to the guest, and is refused to a second execution while
// one uses it.
func TestVolume(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vol := e.volume(t, "v")
	withVolume := func(id string) runtime.Spec {
		img := filepath.Join(e.state, "layers", id+".img")
		if err := e.d.CreateLayer(ctx, img, 64<<20); err != nil {
			t.Fatal(err)
		}
		spec := e.spec(id, img)
		spec.Volume = &runtime.VolumeMount{Image: vol, Path: "/data"}
		return spec
	}

	first := withVolume("v1")
	e.start(t, first)
	e.exec(t, "v1", "sh", "-c", "echo kept > /data/kept.txt")
	if out := e.exec(t, "v1", "sh", "-c", "grep ' /data ' /proc/mounts"); !strings.Contains(out, "ext4") || !strings.Contains(out, "nosuid") || !strings.Contains(out, "nodev") {
		t.Errorf("/data in the guest: %q", out)
	}
	used, capacity, err := e.d.VolumeUsage(ctx, "v1")
	if err != nil || used == 0 || capacity < 50<<20 || capacity > 64<<20 {
		t.Errorf("VolumeUsage = %d, %d, %v", used, capacity, err)
	}

	// In use: refused to a second execution, which leaves nothing.
	second := withVolume("v2")
	if err := e.d.Start(ctx, second); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Start of a second execution on the volume: %v", err)
	}
	if _, err := os.Stat(e.d.dir("v2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused start left its directory: %v", err)
	}
	if n := len(diskimage.LoopsOf(vol)); n != 1 {
		t.Errorf("the volume is attached %d times", n)
	}
	if err := e.d.Probe(ctx, "v1"); err != nil {
		t.Fatalf("the running execution suffered: %v", err)
	}

	if res := e.stop(t, first, runtime.StopNormal); !res.Confirmed {
		t.Error("normal stop with a volume not confirmed")
	}
	if _, _, err := e.d.VolumeUsage(ctx, "v1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("VolumeUsage after stop: %v, want ErrNotFound", err)
	}

	// Another execution, another layer: the volume's data is there.
	e.start(t, second)
	if got := e.exec(t, "v2", "cat", "/data/kept.txt"); got != "kept\n" {
		t.Errorf("/data/kept.txt in the next execution = %q", got)
	}
	// Full at the volume's capacity; the layer still takes writes.
	out := e.exec(t, "v2", "sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M count=80 2>&1; echo rc=$?")
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "rc=0") {
		t.Errorf("writing 80 MiB to a 64 MiB volume: %q", out)
	}
	if got := e.exec(t, "v2", "sh", "-c", "echo layer > /root/layer.txt && cat /root/layer.txt"); got != "layer\n" {
		t.Errorf("the layer with the volume full: %q", got)
	}
	if err := e.d.Probe(ctx, "v2"); err != nil {
		t.Errorf("the guest with the volume full: %v", err)
	}
	// ext4 keeps a few clusters back for its own allocations.
	if used, capacity, err := e.d.VolumeUsage(ctx, "v2"); err != nil || used < capacity-4<<20 {
		t.Errorf("VolumeUsage of the full volume = %d, %d, %v", used, capacity, err)
	}
	e.exec(t, "v2", "sh", "-c", "rm /data/fill && echo synced > /data/synced.txt && sync /data/synced.txt")

	if res := e.stop(t, second, runtime.StopForce); res.Confirmed {
		t.Error("forced stop confirmed")
	}
	// Free after any stop: it can be grown, and mounts cleanly again.
	if err := diskimage.Grow(ctx, vol, 96<<20); err != nil {
		t.Fatalf("Grow after a forced stop: %v", err)
	}
	third := withVolume("v3")
	e.start(t, third)
	if got := e.exec(t, "v3", "cat", "/data/kept.txt", "/data/synced.txt"); got != "kept\nsynced\n" {
		t.Errorf("the volume after a forced stop: %q", got)
	}
	if _, capacity, err := e.d.VolumeUsage(ctx, "v3"); err != nil || capacity < 80<<20 {
		t.Errorf("VolumeUsage after Grow = %d, %v", capacity, err)
	}
	if res := e.stop(t, third, runtime.StopNormal); !res.Confirmed {
		t.Error("normal stop not confirmed")
	}
	if out, err := exec.Command("e2fsck", "-f", "-n", vol).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn of the volume: %v\n%s", err, out)
	}
}

// TestVolumeSpec: volumes the driver cannot mount are refused before
// anything is set up; an execution without a volume has no usage.
func TestVolumeSpec(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img, vol := e.image(t), e.volume(t, "v")
	for _, v := range []runtime.VolumeMount{
		{Image: vol, Path: "data"},
		{Image: vol, Path: "/"},
		{Image: vol, Path: "/data/"},
		{Image: vol, Path: "/proc/x"},
		{Image: vol, Path: "/run"},
		{Image: vol, Path: "/run/kibotos"},
		{Image: filepath.Join(e.state, "missing.img"), Path: "/data"},
		{Image: img, Path: "/data"},
	} {
		spec := e.spec("bad", img)
		spec.Volume = &v
		if err := e.d.Start(ctx, spec); err == nil {
			e.d.Stop(ctx, "bad", runtime.StopForce, 0)
			t.Errorf("Start accepted the volume %+v", v)
		}
		e.assertReleased(t, "bad", img)
		assertNotAttached(t, vol)
	}
	if _, _, err := e.d.VolumeUsage(ctx, "nothing"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("VolumeUsage of an unknown execution: %v", err)
	}
	e.start(t, e.spec("novol", img))
	if _, _, err := e.d.VolumeUsage(ctx, "novol"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("VolumeUsage of an execution without a volume: %v", err)
	}
}

// TestRecoverVolume: the volume of an execution that died while nobody
// watched is released by Recover.
func TestRecoverVolume(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := e.spec("recvol", e.image(t))
	spec.Volume = &runtime.VolumeMount{Image: e.volume(t, "v"), Path: "/srv/data"}
	e.start(t, spec)
	e.exec(t, "recvol", "sh", "-c", "echo x > /srv/data/x")
	if out, err := exec.Command("runc", "--root", e.d.rootDir, "kill", "recvol", "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v %s", err, out)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	e.d.Wait(wctx, "recvol")
	wcancel()
	d2, err := New(Config{StateDir: e.d.stateDir})
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := d2.Recover(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("Recover = %v, %v; want none", ids, err)
	}
	e.assertReleased(t, "recvol", spec.LayerImage)
	assertNotAttached(t, spec.Volume.Image)
}

// BenchmarkCheckGuest measures the periodic probe of a running guest
// (CheckGuest: the agent's PING, the OOM counter, memory pressure);
// cpu-µs/op is the process's CPU per probe.
func BenchmarkCheckGuest(b *testing.B) {
	e := newEnv(b)
	spec := e.spec("probe", e.image(b))
	e.start(b, spec)
	ctx := context.Background()
	cpu := processCPU(b)
	for b.Loop() {
		if c, err := e.d.CheckGuest(ctx, spec.ID); err != nil || c.ProbeErr != nil {
			b.Fatalf("CheckGuest = %+v, %v", c, err)
		}
	}
	b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
}

// processCPU is the CPU time the test process has used.
func processCPU(t testing.TB) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestProbeKept: the periodic probe keeps one connection to the guest
// agent and its cgroup files open; a connection the agent closed is
// dialled again, and a file that fails to read is opened again, without
// the guest reading as unresponsive; a stop closes them.
func TestProbeKept(t *testing.T) {
	e := newEnv(t)
	spec := e.spec("kept", e.image(t))
	e.start(t, spec)
	ctx := context.Background()
	kept := func() *guestProbe {
		e.d.probesMu.Lock()
		defer e.d.probesMu.Unlock()
		return e.d.probes[spec.ID]
	}
	check := func(when string) runtime.GuestCheck {
		t.Helper()
		c, err := e.d.CheckGuest(ctx, spec.ID)
		if err != nil || c.ProbeErr != nil || c.MemoryPressure == nil {
			t.Fatalf("CheckGuest %s = %+v, %v", when, c, err)
		}
		return c
	}
	check("first")
	p := kept()
	if p == nil || p.conn == nil || p.oom.f == nil || p.pressure.f == nil {
		t.Fatalf("kept after a probe: %+v", p)
	}
	conn, oom := p.conn, p.oom.f
	check("second")
	if p.conn != conn || p.oom.f != oom {
		t.Fatal("the second probe did not use what the first kept")
	}

	// An over-long line makes the agent answer ERR and close its end.
	if err := guestabi.WriteProbeLine(conn.c, strings.Repeat("x", guestabi.MaxProbeLine)); err != nil {
		t.Fatal(err)
	}
	if line, err := conn.r.ReadLine(); err != nil || !strings.HasPrefix(line, guestabi.AnswerError) {
		t.Fatalf("answer to an over-long line: %q, %v", line, err)
	}
	// A kept file that no longer reads (as a removed cgroup's reads ENODEV).
	oom.Close()
	check("after the agent closed the connection and a file failed")
	if p.conn == nil || p.conn == conn || p.oom.f == nil || p.oom.f == oom {
		t.Fatalf("not opened again: connection %p (closed %p), file %p (closed %p)", p.conn, conn, p.oom.f, oom)
	}

	e.stop(t, spec, runtime.StopNormal)
	if kept() != nil || !p.closed || p.conn != nil || p.oom.f != nil || p.pressure.f != nil {
		t.Errorf("still kept after the stop: %+v", p)
	}
}

// TestManyLayers: an image of more layers than fit in a page of overlay
// options by their paths still starts, every layer in its place.
func TestManyLayers(t *testing.T) {
	e := newEnv(t)
	// Long paths, as a host's unpacked layers have: 120 layers of about
	// 150 bytes each are four pages of options.
	deep := filepath.Join(t.TempDir(), strings.Repeat("unpacked-layers-", 8))
	for i := range 120 {
		dir := filepath.Join(deep, fmt.Sprintf("%064d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "top"), []byte(fmt.Sprintf("%d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		e.layers = append(e.layers, dir)
	}
	spec := e.spec("layers", e.image(t))
	e.start(t, spec)
	if got := e.exec(t, "layers", "sh", "-c", "cat /top; cat /etc/motd"); got != "119\ntop\n" {
		t.Errorf("the top layer's /top and a lower layer's /etc/motd: %q, want 119 and top", got)
	}
}

// TestStartOnAFullDisk: a workspace whose disk has no inode left cannot
// start, and the error says so and what to do (ENOSPC, which the host
// reports as RESOURCE_EXHAUSTED), rather than an overlay failure.
func TestStartOnAFullDisk(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	spec := e.spec("full", img)
	e.start(t, spec)
	e.exec(t, "full", "sh", "-c", "mkdir /root/many && cd /root/many && i=0; while touch $i 2>/dev/null; do i=$((i+1)); done; echo $i")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.d.Stop(ctx, "full", runtime.StopNormal, time.Second); err != nil {
		t.Fatal(err)
	}
	err := e.d.Start(ctx, spec)
	if err == nil {
		t.Fatal("started on a disk with no inode left")
	}
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "kibotos ws disk") {
		t.Errorf("start on a full disk: %v, want ENOSPC saying to grow the disk", err)
	}
}

// TestStopNamesWhatHoldsTheLayer: a stop whose layer stays attached
// because another mount namespace holds a copy of its mount (a process
// started with unshare -m while the workspace ran) names that process;
// once it ends, the stop goes through.
func TestStopNamesWhatHoldsTheLayer(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	e.start(t, e.spec("held", img))
	holder := exec.Command("unshare", "-m", "--propagation", "private", "sleep", "600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	ended := false
	end := func() {
		if !ended {
			holder.Process.Kill()
			holder.Wait()
			ended = true
		}
	}
	t.Cleanup(end)
	// The copy exists once sleep runs in the new namespace.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", holder.Process.Pid)); strings.TrimSpace(string(comm)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unshare did not start sleep")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := e.d.Stop(ctx, "held", runtime.StopForce, 0)
	if want := fmt.Sprintf("pid %d (sleep)", holder.Process.Pid); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("stop of a layer held elsewhere: %v, want it to name %s", err, want)
	}
	end()
	if _, err := e.d.Stop(ctx, "held", runtime.StopForce, 0); err != nil {
		t.Errorf("stop once the holder ended: %v", err)
	}
}
