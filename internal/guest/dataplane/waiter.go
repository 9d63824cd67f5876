package dataplane

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Waiter starts children and reports their exit: the one owner of
// waiting in the process. pid1.Reaper is the Waiter of the agent
// as PID 1; ChildWaiter serves anywhere else.
type Waiter interface {
	// Spawn calls fork, which starts exactly one child and returns its
	// pid, and arranges for exited to be called once with the child's
	// wait status when it has ended. No exit may be lost between fork
	// and the registration. exited must not block for long.
	Spawn(fork func() (int, error), exited func(unix.WaitStatus)) (int, error)
}

// ChildWaiter waits for each child it started on a goroutine of its own,
// with wait4 on the child's pid. It is for a process that no one else
// reaps with wait4(-1): tests, or the agent run by hand, not as PID 1.
type ChildWaiter struct{}

// Spawn implements Waiter.
func (ChildWaiter) Spawn(fork func() (int, error), exited func(unix.WaitStatus)) (int, error) {
	pid, err := fork()
	if err != nil {
		return pid, err
	}
	go func() {
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		exited(ws)
	}()
	return pid, nil
}
