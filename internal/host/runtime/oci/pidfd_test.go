package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestWaitPidfd: a wait on a pidfd returns nil once its process has
// exited, and the context's error when the context ends first, leaving
// the process running.
func TestWaitPidfd(t *testing.T) {
	wait := func(ctx context.Context, args ...string) (*exec.Cmd, <-chan error) {
		cmd := exec.Command(args[0], args[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pidfd, err := openPidfd(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pidfd.Close() })
		done := make(chan error, 1)
		go func() { done <- waitPidfd(ctx, pidfd) }()
		return cmd, done
	}
	result := func(done <-chan error) error {
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("waitPidfd did not return")
			return nil
		}
	}

	_, exited := wait(t.Context(), "sleep", "0.2")
	if err := result(exited); err != nil {
		t.Errorf("wait on a process that exits: %v", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	long, waiting := wait(ctx, "sleep", "60")
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := result(waiting); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait on a running process: %v, want context.Canceled", err)
	}
	if err := long.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the process no longer runs after the cancelled wait: %v", err)
	}
}

// TestWaitPidfdHoldsNoThread: many waits at once park on the poller
// instead of each holding an OS thread in a blocking poll.
func TestWaitPidfdHoldsNoThread(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	before := hosttest.Threads(t)
	const waits = 64
	var wg sync.WaitGroup
	for range waits {
		pidfd, err := openPidfd(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer pidfd.Close()
		wg.Go(func() { waitPidfd(ctx, pidfd) })
	}
	time.Sleep(300 * time.Millisecond)
	if grown := hosttest.Threads(t) - before; grown >= waits/2 {
		t.Errorf("%d waits added %d threads", waits, grown)
	}
	cancel()
	wg.Wait()
}

// startOf is when process pid started, as runc records it.
func startOf(t *testing.T, pid int) uint64 {
	t.Helper()
	start, ok := processStart(pid)
	if !ok {
		t.Fatalf("no process %d", pid)
	}
	return start
}

// TestRuncStateRecords: a record naming a live process with its start time
// is running, or created while runc's exec FIFO is there; one whose PID
// another process holds (another start time) is stopped; no record is
// errNoContainer; a record without an init process is errUnknownRecord,
// which sends the driver to runc.
func TestRuncStateRecords(t *testing.T) {
	root := t.TempDir()
	record := func(id, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, id, "state.json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pid := os.Getpid()
	start := startOf(t, pid)
	record("live", fmt.Sprintf(`{"id":"live","init_process_pid":%d,"init_process_start":%d,"config":{}}`, pid, start))
	// Another order than runc's: the fields after the config.
	record("late", fmt.Sprintf(`{"config":{"mounts":[{"a":"}"},2]},"init_process_start":%d,"id":"late","init_process_pid":%d}`, start, pid))
	record("created", fmt.Sprintf(`{"id":"created","init_process_pid":%d,"init_process_start":%d}`, pid, start))
	if err := os.WriteFile(filepath.Join(root, "created", "exec.fifo"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	record("reused", fmt.Sprintf(`{"id":"reused","init_process_pid":%d,"init_process_start":%d}`, pid, start+1))
	record("gone", `{"id":"gone","init_process_pid":2147483646,"init_process_start":1}`)
	record("unknown", `{"id":"unknown","init_process_pid":5}`)
	record("garbled", `{"id":`)
	for id, want := range map[string]containerState{
		"live":    {ID: "live", Pid: pid, Status: "running"},
		"late":    {ID: "late", Pid: pid, Status: "running"},
		"created": {ID: "created", Pid: pid, Status: "created"},
		"reused":  {ID: "reused", Status: "stopped"},
		"gone":    {ID: "gone", Status: "stopped"},
	} {
		if got, err := runcStateFromRecord(root, id); err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", id, got, err, want)
		}
	}
	if _, err := runcStateFromRecord(root, "missing"); !errors.Is(err, errNoContainer) {
		t.Errorf("no record: %v, want errNoContainer", err)
	}
	for _, id := range []string{"unknown", "garbled"} {
		if _, err := runcStateFromRecord(root, id); !errors.Is(err, errUnknownRecord) {
			t.Errorf("%s: %v, want errUnknownRecord", id, err)
		}
	}
}

// TestRuncStateMatchesRunc: what the driver reads from runc's record is
// what `runc state` prints for a running execution, after its init was
// killed, and once runc deleted the container.
func TestRuncStateMatchesRunc(t *testing.T) {
	e := newEnv(t)
	if e.d.name != Runc {
		t.Skipf("the driver runs %s", e.d.name)
	}
	spec := e.spec("state", e.image(t))
	e.start(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	same := func(when string) containerState {
		t.Helper()
		got, gerr := runcStateFromRecord(e.d.rootDir, spec.ID)
		want, werr := e.d.cliState(ctx, spec.ID)
		if got != want || errors.Is(gerr, errNoContainer) != errors.Is(werr, errNoContainer) || (gerr == nil) != (werr == nil) {
			t.Errorf("%s: read %+v (%v), runc state %+v (%v)", when, got, gerr, want, werr)
		}
		return got
	}
	if st := same("running"); st.Status != "running" || st.Pid <= 0 {
		t.Errorf("running execution: %+v", st)
	}
	if err := e.d.kill(ctx, spec.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	for st, _ := e.d.cliState(ctx, spec.ID); st.alive(); st, _ = e.d.cliState(ctx, spec.ID) {
		if ctx.Err() != nil {
			t.Fatal("init still runs after the driver's KILL")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := same("killed"); st.Status != "stopped" {
		t.Errorf("killed execution: %+v", st)
	}
	if err := e.d.deleteContainer(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	same("deleted")
}

// TestSignalRuncInit: the signal reaches the process a record names while
// it runs with the recorded start time; a record whose PID another process
// holds, or no record, signals nothing and is not an error; a signal name
// unknown here sends the driver to runc.
func TestSignalRuncInit(t *testing.T) {
	root := t.TempDir()
	sleeper := func() (*exec.Cmd, uint64) {
		t.Helper()
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		start := startOf(t, cmd.Process.Pid)
		return cmd, start
	}
	record := func(id string, pid int, start uint64) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, id), 0o700); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"id":%q,"init_process_pid":%d,"init_process_start":%d}`, id, pid, start)
		if err := os.WriteFile(filepath.Join(root, id, "state.json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	target, start := sleeper()
	record("target", target.Process.Pid, start)
	bystander, bstart := sleeper()
	record("reused", bystander.Process.Pid, bstart+1)

	if err := signalRuncInit(root, "reused", "KILL"); err != nil {
		t.Errorf("a PID another process holds: %v", err)
	}
	if err := signalRuncInit(root, "missing", "KILL"); err != nil {
		t.Errorf("no record: %v", err)
	}
	if err := signalRuncInit(root, "target", "NOSUCH"); !errors.Is(err, errUnknownRecord) {
		t.Errorf("an unknown signal name: %v, want errUnknownRecord", err)
	}
	if err := signalRuncInit(root, "target", "KILL"); err != nil {
		t.Fatal(err)
	}
	if err := target.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("the recorded init ended with %v, want killed", err)
	}
	if err := signalRuncInit(root, "target", "KILL"); err != nil {
		t.Errorf("an init that has ended: %v", err)
	}
	if !processIs(bystander.Process.Pid, bstart) {
		t.Error("the process holding a PID of another start time was signalled")
	}
}
