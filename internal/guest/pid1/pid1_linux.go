package pid1

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Reaper owns all waiting for children of the guest's PID 1. As PID 1 the
// agent inherits every orphan of the pid namespace, so it must wait for
// any child (wait4(-1)); that same wait would also collect the exit
// status of a process some service started and wants to report. So no one
// but the Reaper waits: a service starts its children through Spawn,
// which registers the child's pid, and the Reaper hands the status of a
// registered pid to its callback instead of dropping it. os/exec's Wait
// must not be used in the agent: it would race the Reaper for the status.
//
// Spawn forks while holding the Reaper's lock, and reaping takes the same
// lock, so a child that exits at once cannot be collected before its pid
// is registered.
type Reaper struct {
	mu      sync.Mutex
	waiting map[int]func(unix.WaitStatus)
}

// NewReaper returns a Reaper with no registered child.
func NewReaper() *Reaper {
	return &Reaper{waiting: make(map[int]func(unix.WaitStatus))}
}

// Spawn calls fork, which must start exactly one child and return its
// pid, and arranges for exited to be called once, on a goroutine of the
// Reaper, with the child's wait status when it has ended. exited must not
// block for long.
func (r *Reaper) Spawn(fork func() (int, error), exited func(unix.WaitStatus)) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return pid, err
	}
	r.waiting[pid] = exited
	return pid, nil
}

// Run reaps every exited child, on SIGCHLD, until ctx ends.
func (r *Reaper) Run(ctx context.Context) {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, unix.SIGCHLD)
	defer signal.Stop(ch)
	for {
		r.ReapOnce()
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// ReapOnce reaps the children that have exited, without blocking, hands
// the statuses of registered ones to their callbacks, and returns how many
// it reaped.
func (r *Reaper) ReapOnce() int {
	type exit struct {
		fn func(unix.WaitStatus)
		ws unix.WaitStatus
	}
	var exits []exit
	n := 0
	r.mu.Lock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			break
		}
		n++
		if fn, ok := r.waiting[pid]; ok {
			delete(r.waiting, pid)
			exits = append(exits, exit{fn, ws})
		}
	}
	r.mu.Unlock()
	// Outside the lock: a callback may start another child.
	for _, e := range exits {
		e.fn(e.ws)
	}
	return n
}

// TerminateAll ends every other process of the pid namespace: SIGTERM,
// up to grace for them to exit, SIGKILL for the rest; then it syncs the
// filesystems. The exits of registered children reach their callbacks.
// Only PID 1 may call it: kill(-1) from anywhere else would reach every
// process the caller may signal.
func (r *Reaper) TerminateAll(grace time.Duration) error {
	if os.Getpid() != 1 {
		return errors.New("guestagent: TerminateAll outside PID 1")
	}
	var err error
	if e := unix.Kill(-1, unix.SIGTERM); e != nil && !errors.Is(e, unix.ESRCH) {
		err = e
	}
	if !r.waitNoOthers(grace) {
		if e := unix.Kill(-1, unix.SIGKILL); e != nil && !errors.Is(e, unix.ESRCH) {
			err = e
		}
		if !r.waitNoOthers(5 * time.Second) {
			err = errors.Join(err, errors.New("guestagent: processes survived SIGKILL"))
		}
	}
	unix.Sync()
	return err
}

// waitNoOthers reaps and polls /proc until no process but this one lives,
// or d passes; it reports whether none is left.
func (r *Reaper) waitNoOthers(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		r.ReapOnce()
		if len(otherLive()) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// otherLive lists the pids in /proc, other than this process, that are
// not zombies. Processes entered from outside (runc exec) are in the pid
// namespace but not our descendants, so /proc, not wait, tells.
func otherLive() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if state, ok := procState(pid); ok && state != 'Z' && state != 'X' {
			pids = append(pids, pid)
		}
	}
	return pids
}

// procState returns the state letter of /proc/<pid>/stat.
func procState(pid int) (byte, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, false
	}
	return s[i+2], true
}
