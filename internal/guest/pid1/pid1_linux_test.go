package pid1

import (
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReaperDispatch checks that the Reaper hands the status of a child
// started through Spawn to its callback and silently reaps any other.
// wait4(-1) reaps every child of the test binary: this package's tests
// start no other children.
func TestReaperDispatch(t *testing.T) {
	r := NewReaper()
	attr := &syscall.ProcAttr{Env: []string{"PATH=/usr/bin:/bin"}}
	got := make(chan unix.WaitStatus, 1)
	pid, err := r.Spawn(func() (int, error) {
		return syscall.ForkExec("/bin/sh", []string{"sh", "-c", "exit 7"}, attr)
	}, func(ws unix.WaitStatus) { got <- ws })
	if err != nil {
		t.Fatal(err)
	}
	// An unregistered child (an orphan, as PID 1 sees it).
	other, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "exit 3"}, attr)
	if err != nil {
		t.Fatal(err)
	}
	reaped := 0
	deadline := time.Now().Add(10 * time.Second)
	for reaped < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("reaped %d of 2 children (pids %d, %d)", reaped, pid, other)
		}
		reaped += r.ReapOnce()
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case ws := <-got:
		if !ws.Exited() || ws.ExitStatus() != 7 {
			t.Fatalf("status %v, want exit 7", ws)
		}
	default:
		t.Fatal("exit callback not called")
	}
	if len(r.waiting) != 0 {
		t.Fatalf("still waiting for %v", r.waiting)
	}
	// A failed fork registers nothing.
	if _, err := r.Spawn(func() (int, error) {
		return syscall.ForkExec("/nonexistent", []string{"x"}, attr)
	}, func(unix.WaitStatus) { t.Error("callback for a failed start") }); err == nil {
		t.Fatal("Spawn of a missing program succeeded")
	}
	if len(r.waiting) != 0 {
		t.Fatalf("failed start registered %v", r.waiting)
	}
}
