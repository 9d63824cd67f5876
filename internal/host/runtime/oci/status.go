package oci

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

const (
	agentSocket  = guestabi.ProbeSocket
	probeTimeout = 5 * time.Second // when ctx has no deadline
	statusProbe  = time.Second     // the readiness probe inside Status
)

// Probe asks the guest agent whether it is ready (PING → READY); nil
// means ready. Without a deadline in ctx it gives up after 5 s.
func (d *Driver) Probe(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if _, err := os.Stat(d.dir(id)); errors.Is(err, os.ErrNotExist) {
		return runtime.ErrNotFound
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, probeTimeout)
		defer cancel()
	}
	_, err := d.agentCommand(ctx, id, guestabi.CommandPing, guestabi.AnswerReady)
	return err
}

// stopAgent asks the guest agent to end every process within grace, sync
// and exit (STOP → STOPPED).
func (d *Driver) stopAgent(ctx context.Context, id string, grace time.Duration) error {
	_, err := d.agentCommand(ctx, id, guestabi.StopLine(grace), guestabi.AnswerStopped)
	return err
}

// agentCommand sends one command line of the probe protocol to the guest
// agent on a connection of its own, checks that the answer is want and
// returns the answer's argument.
func (d *Driver) agentCommand(ctx context.Context, id, command, want string) (string, error) {
	p, err := d.dialProbe(ctx, id)
	if err != nil {
		return "", fmt.Errorf("oci: guest agent of %s: %w", id, err)
	}
	defer p.c.Close()
	arg, err := p.exchange(ctx, command, want)
	if err != nil {
		return "", fmt.Errorf("oci: guest agent of %s: %w", id, err)
	}
	return arg, nil
}

// DialGuest connects to a socket of the guest agent; see runtime.Driver.
// It goes through an O_PATH descriptor of the socket directory, because
// StateDir/exec/<id>/sock can be longer than a unix socket address allows.
func (d *Driver) DialGuest(ctx context.Context, id, name string) (net.Conn, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("oci: invalid guest socket name %q", name)
	}
	dir, err := d.openSocketDir(id)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dir)
	// The guest writes in this directory: never follow a link it planted
	// (it would lead the host to any unix socket, another workspace's
	// included). Open the name itself and require a socket.
	fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("oci: guest socket %s: %w", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("oci: guest socket %s is not a socket", name)
	}
	var dialer net.Dialer
	return dialer.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", fd))
}

// openSocketDir returns an O_PATH descriptor of the execution's socket
// directory, which the guest writes in: open names below it with
// O_NOFOLLOW.
func (d *Driver) openSocketDir(id string) (int, error) {
	return unix.Open(filepath.Join(d.dir(id), "sock"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// guestShutdown reports whether the guest agent of an ended execution
// recorded a shutdown (guestabi.EndFile). The guest could have left
// anything at the name: only a regular file is read, and only its first
// bytes.
func (d *Driver) guestShutdown(id string) bool {
	dir, err := d.openSocketDir(id)
	if err != nil {
		return false
	}
	defer unix.Close(dir)
	fd, err := unix.Openat(dir, guestabi.EndFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), guestabi.EndFile)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	b := make([]byte, guestabi.MaxEndFile)
	n, _ := io.ReadFull(f, b)
	return guestabi.Shutdown(b[:n])
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Status observes an execution; see runtime.Driver. Ready is a live probe
// of the guest agent (up to a second). ExitCode is -1 once init has
// ended: the driver cannot observe a detached init's exit status.
func (d *Driver) Status(ctx context.Context, id string) (runtime.Status, error) {
	if err := checkID(id); err != nil {
		return runtime.Status{}, err
	}
	st, err := d.state(ctx, id)
	if errors.Is(err, errNoContainer) {
		if _, serr := os.Stat(d.dir(id)); serr == nil {
			// Set up but without a container: a start that did not get
			// through or a container removed behind the driver's back.
			return runtime.Status{ExitCode: -1}, nil
		}
		return runtime.Status{}, runtime.ErrNotFound
	}
	if err != nil {
		return runtime.Status{}, err
	}
	s := runtime.Status{Running: st.alive()}
	s.OOMKills, _ = oomKills(id)
	s.OOMKilled = s.OOMKills > 0
	if s.Running {
		pctx, cancel := context.WithTimeout(ctx, statusProbe)
		s.Ready = d.Probe(pctx, id) == nil
		cancel()
	} else {
		s.ExitCode = -1
		s.Shutdown = d.guestShutdown(id)
	}
	return s, nil
}

// Wait blocks until the execution's init ends or ctx ends; see
// runtime.Driver. It watches init through a pidfd.
func (d *Driver) Wait(ctx context.Context, id string) (runtime.Status, error) {
	if err := checkID(id); err != nil {
		return runtime.Status{}, err
	}
	if err := d.waitStopped(ctx, id); err != nil && !errors.Is(err, errNoContainer) {
		return runtime.Status{}, err
	}
	return d.Status(ctx, id)
}

// waitStopped returns once the container's init has ended (or the
// container is gone: errNoContainer) or ctx ends.
func (d *Driver) waitStopped(ctx context.Context, id string) error {
	for {
		st, err := d.state(ctx, id)
		if err != nil {
			return err
		}
		if !st.alive() {
			return nil
		}
		if st.Pid > 0 {
			if pidfd, err := openPidfd(st.Pid); err == nil {
				// Is the process behind the pidfd still the container's
				// init? Then wait on it; else look again.
				if st2, err := d.state(ctx, id); err == nil && st2.alive() && st2.Pid == st.Pid {
					err = waitPidfd(ctx, pidfd)
					pidfd.Close()
					if err != nil {
						return err
					}
					continue
				}
				pidfd.Close()
				continue
			}
		}
		select { // created or paused, or no pidfd: poll
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// openPidfd opens a pidfd of process pid that Go's poller watches: a wait
// on it holds no thread and wakes only when the process ends, which
// matters with a thousand idle executions each waited on.
func openPidfd(pid int) (*os.File, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "pidfd"), nil
}

// signalPidfd sends sig to the process of pidfd (openPidfd).
func signalPidfd(pidfd *os.File, sig unix.Signal) error {
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return err
	}
	if cerr := rc.Control(func(fd uintptr) { err = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); cerr != nil {
		return cerr
	}
	return err
}

// waitPidfd waits until the process of pidfd (openPidfd) exits or ctx
// ends.
func waitPidfd(ctx context.Context, pidfd *os.File) error {
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { pidfd.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var pollErr error
	err = rc.Read(func(fd uintptr) bool {
		// A pidfd is readable once its process has exited; until then,
		// returning false parks this goroutine on the poller.
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		if err != nil && !errors.Is(err, unix.EINTR) {
			pollErr = err
			return true
		}
		return n > 0
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return cmp.Or(pollErr, err)
}

// Exec runs args in the running execution id (runc exec) and returns
// their combined output; a non-zero exit is an *exec.ExitError. It is
// meant for tests and host-side maintenance; the guest's processes come
// from the guest agent.
func (d *Driver) Exec(ctx context.Context, id string, args ...string) ([]byte, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if len(args) == 0 {
		return nil, errors.New("oci: Exec needs a command")
	}
	cmd := d.runtimeCmd(ctx, append([]string{"exec", id}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out, fmt.Errorf("oci: exec %v in %s: %w: %s", args, id, ee, strings.TrimSpace(string(out)))
		}
		return out, ctxErr(ctx, err)
	}
	return out, nil
}
