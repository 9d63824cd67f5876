package guestagent

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Reap reaps every exited child until ctx ends. As PID 1 of the guest's
// pid namespace the agent inherits every orphan, so nothing else would.
// Reap waits for any child (wait4(-1)): a later service that starts
// processes must learn their exit status from the reaper, not from
// os/exec's Wait.
func Reap(ctx context.Context) {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, unix.SIGCHLD)
	defer signal.Stop(ch)
	for {
		ReapOnce()
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// ReapOnce reaps the children that have exited, without blocking, and
// returns how many it reaped.
func ReapOnce() int {
	n := 0
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return n
		}
		n++
	}
}

// TerminateAll ends every other process of the pid namespace: SIGTERM,
// up to grace for them to exit, SIGKILL for the rest; then it syncs the
// filesystems. Only PID 1 may call it: kill(-1) from anywhere else would
// reach every process the caller may signal.
func TerminateAll(grace time.Duration) error {
	if os.Getpid() != 1 {
		return errors.New("guestagent: TerminateAll outside PID 1")
	}
	var err error
	if e := unix.Kill(-1, unix.SIGTERM); e != nil && !errors.Is(e, unix.ESRCH) {
		err = e
	}
	if !waitNoOthers(grace) {
		if e := unix.Kill(-1, unix.SIGKILL); e != nil && !errors.Is(e, unix.ESRCH) {
			err = e
		}
		if !waitNoOthers(5 * time.Second) {
			err = errors.Join(err, errors.New("guestagent: processes survived SIGKILL"))
		}
	}
	unix.Sync()
	return err
}

// waitNoOthers reaps and polls /proc until no process but this one lives,
// or d passes; it reports whether none is left.
func waitNoOthers(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		ReapOnce()
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
