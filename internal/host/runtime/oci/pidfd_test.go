package oci

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
	before := threads(t)
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
	if grown := threads(t) - before; grown >= waits/2 {
		t.Errorf("%d waits added %d threads", waits, grown)
	}
	cancel()
	wg.Wait()
}

// threads is how many threads this process has.
func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), "Threads:")
	line, _, _ := strings.Cut(rest, "\n")
	n, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
