package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// inputChunk bounds the bytes of one SendInput.
const inputChunk = 32 << 10

// PTYSize is the size of a pseudo-terminal, in characters.
type PTYSize struct {
	Cols, Rows uint16
}

// ExecOptions describe a process to run.
type ExecOptions struct {
	// Env is added to the guest's environment, over the defaults of WithEnv
	// and Workspace.SetEnv.
	Env map[string]string
	// Cwd is the working directory; empty is the user's home directory.
	Cwd string
	// User is a user of the guest; empty is root.
	User string
	// Tag names the process for Connect; unique among running processes.
	Tag string
	// Stdin, when set, is forwarded to the process's standard input, which
	// is closed at its EOF, or when a Read fails (Wait and Exec then return
	// that error, "reading stdin: …", with the exit status); when nil the
	// process reads an empty input. A Read blocked when the process exits
	// is left to return on its own.
	Stdin io.Reader
	// Stdout and Stderr receive the process's output, in order; nil
	// discards it. On a PTY all output goes to Stdout.
	Stdout, Stderr io.Writer
	// PTY runs the process on a pseudo-terminal of this size; nil runs it
	// on pipes.
	PTY *PTYSize
	// EndWithCaller has the guest kill the process and its group when the
	// stream that started it ends before the process does: the caller
	// died, gave up, or lost its connection. Otherwise a process outlives
	// its caller, and one that waits for input (Stdin) waits for ever.
	EndWithCaller bool
}

// ExitStatus is how a process ended: Code when it exited, Signal (such as
// "SIGKILL") when a signal ended it.
type ExitStatus struct {
	Code   int
	Signal string
}

// Success reports whether the process exited with code 0.
func (s ExitStatus) Success() bool { return s.Code == 0 && s.Signal == "" }

func (s ExitStatus) String() string {
	if s.Signal != "" {
		return "signal " + s.Signal
	}
	return "exit status " + strconv.Itoa(s.Code)
}

// ProcessRef names a process of a Workspace by pid or by tag.
type ProcessRef struct {
	pid int
	tag string
	// boot is the boot of the guest the process was started in, once a
	// stream of it said so: its calls then never reach a process of a
	// later boot (the guest reset) that took its pid.
	boot string
}

// PID names the process with this pid.
func PID(pid int) ProcessRef { return ProcessRef{pid: pid} }

// Tag names the process started with this tag.
func Tag(tag string) ProcessRef { return ProcessRef{tag: tag} }

func (r ProcessRef) String() string {
	if r.tag != "" {
		return "tag " + r.tag
	}
	return "pid " + strconv.Itoa(r.pid)
}

func (r ProcessRef) selector() *datav1.ProcessSelector {
	if r.tag != "" {
		return &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Tag{Tag: r.tag}, BootId: r.boot}
	}
	return &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: int32(r.pid)}, BootId: r.boot}
}

// startedRef is the reference of the process a stream's started event
// names.
func startedRef(started *datav1.ProcessEvent_Started) ProcessRef {
	return ProcessRef{pid: int(started.GetPid()), boot: started.GetBootId()}
}

// Exec runs args in the Workspace and waits for it to end: args[0] is the
// program, looked up in PATH. Output streams to o.Stdout and o.Stderr as
// it arrives. A process that ran and exited non-zero, or was killed, is
// not an error: the ExitStatus says so. When ctx ends first, Exec kills the
// process (SIGKILL to its process group) and returns ctx's error; so it
// does when following the process fails otherwise (writing its output to
// o.Stdout failed, the connection broke): Exec leaves nothing running, or,
// when the data plane cannot be reached to kill it for killTimeout (the
// deployment restarts), or refuses the kill unavailable while the control
// plane says the Workspace still runs the process's execution (a host
// agent just restarted, out of service until ctrl takes its
// registration), says in its error that the process may still run. A
// Workspace that stopped ended the process with its execution: Exec then
// returns at once.
// Once Exec returns it writes nothing more, but for a write to o.Stdout or
// o.Stderr that still blocks outputGrace after ctx ended: Exec returns
// without it, and that write is left to return on its own. Use Start for a
// process that outlives the call.
func (w *Workspace) Exec(ctx context.Context, args []string, o ExecOptions) (ExitStatus, error) {
	p, err := w.Start(ctx, args, o)
	if err != nil {
		return ExitStatus{}, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		// The stream ends with ctx, and its output with it, unless a write
		// to the caller's writer blocks, which nothing can interrupt.
		select {
		case <-p.done:
		case <-time.After(outputGrace):
		}
	}
	var st ExitStatus
	select {
	case <-p.done:
		defer p.Close()
		if st, err = p.Wait(); err == nil || p.exited() {
			return st, err // an error reading Stdin comes with the exit
		}
	default:
		defer p.cancel()
	}
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer cancel()
	_, gen := p.target()
	ended := func(ctx context.Context) bool { return w.executionEnded(ctx, gen) }
	switch kerr := killWhileItMayRun(kctx, p.Kill, ended); {
	case kerr == nil, connect.CodeOf(kerr) == connect.CodeNotFound, connect.CodeOf(kerr) == connect.CodeFailedPrecondition: // killed, or it ended
	case notReached(kerr):
		return st, fmt.Errorf("%w (pid %d may still run: the data plane could not be reached to kill it: %v)", err, p.Pid(), kerr)
	case connect.CodeOf(kerr) == connect.CodeUnavailable:
		return st, fmt.Errorf("%w (pid %d may still run: the data plane could not kill it while workspace %s runs: %v)", err, p.Pid(), w.id, kerr)
	default:
		return st, fmt.Errorf("%w (killing the process: %v)", err, kerr)
	}
	return st, err
}

// killTimeout bounds the kill Exec sends when its context ends.
const killTimeout = 10 * time.Second

// killRetry is how often Exec tries its kill again while the data plane
// cannot be reached, or cannot serve it yet.
const killRetry = 200 * time.Millisecond

// killWhileItMayRun calls kill until it is answered, or ctx ends, and
// returns kill's last error; nil also when the process ended with its
// execution. A kill is tried again while the data plane cannot be reached
// (the deployment restarts), and while it answers unavailable unless ended
// says the execution the process belongs to has ended. The data plane
// answers unavailable both for a workspace that stopped, whose processes
// ended with it, and for one that runs on while the data plane cannot
// serve it yet: a host agent just restarted serves nothing until the
// control plane takes its registration ("this host is out of service"),
// nor a workspace before it finds its execution running again. Only the
// control plane tells them apart.
func killWhileItMayRun(ctx context.Context, kill func(context.Context) error, ended func(context.Context) bool) error {
	for {
		err := kill(ctx)
		switch {
		case notReached(err):
		case connect.CodeOf(err) != connect.CodeUnavailable:
			return err
		case ended(ctx):
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(killRetry):
		}
	}
}

// executionEnded reports whether the control plane says the Workspace no
// longer runs its execution of run gen (0: whichever ran): it is not
// AVAILABLE (it stopped, or stops, and its processes with it; it was
// deleted or failed), or it runs a later generation. When the control plane
// cannot say (it cannot be reached, or refuses the call), or the Workspace
// is AVAILABLE or UNKNOWN (its host not heard from) at gen, the execution
// may run: false.
func (w *Workspace) executionEnded(ctx context.Context, gen uint64) bool {
	resp, err := w.c.workspaces().GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: w.id}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return true
	}
	if err != nil {
		return false
	}
	ws := resp.Msg.GetWorkspace()
	switch ws.GetState() {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN:
		return gen != 0 && ws.GetGeneration() != gen
	}
	return true
}

// outputGrace is how long Exec, its context ended, waits for a write to
// the caller's writers to return before it returns without it.
const outputGrace = time.Second

// Start starts args in the Workspace and returns once the process runs. Its
// output streams to o.Stdout and o.Stderr, and o.Stdin to its input, until
// it exits or ctx ends; Wait waits for the exit. When ctx ends before the
// guest has said the process runs, Start returns ctx's error, and kills the
// process if the guest starts it still.
func (w *Workspace) Start(ctx context.Context, args []string, o ExecOptions) (*Process, error) {
	req := &datav1.StartProcessRequest{Args: args, Env: w.env(o.Env), Cwd: o.Cwd, User: o.User, Tag: o.Tag, Stdin: o.Stdin != nil,
		EndWithCaller: o.EndWithCaller}
	if o.PTY != nil {
		req.Pty = &datav1.Pty{Cols: uint32(o.PTY.Cols), Rows: uint32(o.PTY.Rows)}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The stream is opened on a context of its own, which ctx ends only
	// once the process's started event has come: a process the guest
	// starts after ctx ended would otherwise run on, its PID known to nobody.
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	opened := make(chan startedStream, 1)
	go func() {
		stream, ok, gen, err := serverStreamIn(streamCtx, w, 0, func(d *dataPlane) func(context.Context, *connect.Request[datav1.StartProcessRequest]) (*connect.ServerStreamForClient[datav1.ProcessEvent], error) {
			return d.proc.StartProcess
		}, req)
		opened <- startedStream{stream, ok, gen, err}
	}()
	var s startedStream
	select {
	case s = <-opened:
	case <-ctx.Done():
		go w.killWhenStarted(opened, cancel)
		return nil, ctx.Err()
	}
	if s.err != nil {
		cancel()
		return nil, s.err
	}
	started := s.stream.Msg().GetStarted()
	if !s.ok || started == nil {
		s.stream.Close()
		cancel()
		return nil, errors.New("StartProcess: the stream did not begin with the started event")
	}
	stop := context.AfterFunc(ctx, cancel)
	p := newProcess(w, startedRef(started), s.gen, func() { stop(); cancel() })
	go p.follow(s.stream, false, o.Stdout, o.Stderr)
	if o.Stdin != nil {
		go p.forwardInput(ctx, o.Stdin)
	}
	return p, nil
}

// startedStream is what opening a StartProcess stream gave: the stream,
// whether its first message was received, the run of the Workspace it
// reached, or the error.
type startedStream struct {
	stream *connect.ServerStreamForClient[datav1.ProcessEvent]
	ok     bool
	gen    uint64
	err    error
}

// killWhenStarted waits, up to killTimeout, for a StartProcess stream whose
// caller left before the process's started event came, and kills the
// process that event names; cancel ends the stream.
func (w *Workspace) killWhenStarted(opened <-chan startedStream, cancel context.CancelFunc) {
	defer cancel()
	giveUp := time.AfterFunc(killTimeout, cancel)
	defer giveUp.Stop()
	s := <-opened
	if s.err != nil {
		return
	}
	defer s.stream.Close()
	if started := s.stream.Msg().GetStarted(); s.ok && started != nil {
		kctx, kcancel := context.WithTimeout(context.Background(), killTimeout)
		defer kcancel()
		newProcess(w, startedRef(started), s.gen, kcancel).Kill(kctx)
	}
}

// Connect attaches to a running or recently ended process of the
// Workspace: the output the guest buffered for it comes first, then new
// output and the exit, to stdout and stderr (nil discards). It returns at
// once; Wait reports a process that is not found. A process named by tag
// is the one the guest finds now: the handle then names it by its pid.
func (w *Workspace) Connect(ctx context.Context, ref ProcessRef, stdout, stderr io.Writer) (*Process, error) {
	return w.connectIn(ctx, ref, 0, stdout, stderr)
}

// connectIn is Connect in the Workspace's run gen (0: the current one).
func (w *Workspace) connectIn(ctx context.Context, ref ProcessRef, gen uint64, stdout, stderr io.Writer) (*Process, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := newProcess(w, ref, gen, cancel)
	go func() {
		stream, ok, reached, err := serverStreamIn(ctx, w, gen, func(d *dataPlane) func(context.Context, *connect.Request[datav1.ConnectProcessRequest]) (*connect.ServerStreamForClient[datav1.ProcessEvent], error) {
			return d.proc.ConnectProcess
		}, &datav1.ConnectProcessRequest{Process: ref.selector()})
		if err != nil {
			p.finish(ExitStatus{}, err)
			return
		}
		p.mu.Lock()
		p.gen = reached
		p.mu.Unlock()
		p.follow(stream, ok, stdout, stderr)
	}()
	return p, nil
}

// Processes lists the processes started in the Workspace that run, and
// those that ended recently.
func (w *Workspace) Processes(ctx context.Context) ([]*datav1.ProcessInfo, error) {
	resp, err := unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.ListProcessesRequest]) (*connect.Response[datav1.ListProcessesResponse], error) {
		return d.proc.ListProcesses
	}, &datav1.ListProcessesRequest{})
	return resp.GetProcesses(), err
}

// Process is a process of a Workspace that a Start or Connect follows. It
// belongs to one run of the Workspace and one boot of its guest: after a
// stop and start, or a reset of the guest (a reboot inside it), its calls
// are not found rather than reach a new process that has its pid.
type Process struct {
	w      *Workspace
	cancel context.CancelFunc // ends the stream and the input forwarding
	done   chan struct{}      // closed when the stream has ended

	mu       sync.Mutex
	ref      ProcessRef // its pid once the guest said it
	gen      uint64     // the run of the Workspace it belongs to; 0 until known
	pid      int
	closed   bool
	status   ExitStatus
	err      error
	inputErr error // reading Stdin failed
}

func newProcess(w *Workspace, ref ProcessRef, gen uint64, cancel context.CancelFunc) *Process {
	return &Process{w: w, ref: ref, gen: gen, pid: ref.pid, cancel: cancel, done: make(chan struct{})}
}

// target is what the process's calls name: the process, and the run of
// the Workspace it belongs to.
func (p *Process) target() (*datav1.ProcessSelector, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ref.selector(), p.gen
}

// Pid returns the process's pid in the guest; 0 when Connect named it by
// tag and the guest has not said its pid yet.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// Wait waits until the process exits and returns how it ended. It is an
// error when the stream ended first: the context of Start or Connect
// ended, the connection broke, Close detached (ErrDetached), or the
// output could not be written (*OutputError); the process may still run.
// An error reading ExecOptions.Stdin is returned with the status.
func (p *Process) Wait() (ExitStatus, error) {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil && p.inputErr != nil {
		return p.status, p.inputErr
	}
	return p.status, p.err
}

// exited reports whether the guest told the process's exit before its
// stream ended.
func (p *Process) exited() bool {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err == nil
}

// Close stops following the process and forwarding its input, without
// ending the process; a Wait that is blocked returns ErrDetached.
func (p *Process) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	<-p.done
}

// Signal sends a signal, such as "SIGTERM" or "KILL", to the process's
// process group.
func (p *Process) Signal(ctx context.Context, signal string) error {
	sel, gen := p.target()
	_, err := unaryIn(ctx, p.w, gen, func(d *dataPlane) func(context.Context, *connect.Request[datav1.SignalProcessRequest]) (*connect.Response[datav1.SignalProcessResponse], error) {
		return d.proc.SignalProcess
	}, &datav1.SignalProcessRequest{Process: sel, Signal: signal})
	return err
}

// Kill kills the process and its process group with SIGKILL.
func (p *Process) Kill(ctx context.Context) error {
	return p.Signal(ctx, "SIGKILL")
}

// SendInput writes data to the process's input or PTY. A process started
// without ExecOptions.Stdin has no input to write to.
func (p *Process) SendInput(ctx context.Context, data []byte) error {
	sel, gen := p.target()
	_, err := unaryIn(ctx, p.w, gen, func(d *dataPlane) func(context.Context, *connect.Request[datav1.SendInputRequest]) (*connect.Response[datav1.SendInputResponse], error) {
		return d.proc.SendInput
	}, &datav1.SendInputRequest{Process: sel, Data: data})
	return err
}

// CloseInput closes the process's input.
func (p *Process) CloseInput(ctx context.Context) error {
	sel, gen := p.target()
	_, err := unaryIn(ctx, p.w, gen, func(d *dataPlane) func(context.Context, *connect.Request[datav1.CloseInputRequest]) (*connect.Response[datav1.CloseInputResponse], error) {
		return d.proc.CloseInput
	}, &datav1.CloseInputRequest{Process: sel})
	return err
}

// Resize changes the size of the process's PTY.
func (p *Process) Resize(ctx context.Context, size PTYSize) error {
	sel, gen := p.target()
	_, err := unaryIn(ctx, p.w, gen, func(d *dataPlane) func(context.Context, *connect.Request[datav1.ResizeTerminalRequest]) (*connect.Response[datav1.ResizeTerminalResponse], error) {
		return d.proc.ResizeTerminal
	}, &datav1.ResizeTerminalRequest{Process: sel, Size: &datav1.Pty{Cols: uint32(size.Cols), Rows: uint32(size.Rows)}})
	return err
}

// Connect attaches to the process again, for instance after Wait reported
// a broken stream; see Workspace.Connect.
func (p *Process) Connect(ctx context.Context, stdout, stderr io.Writer) (*Process, error) {
	p.mu.Lock()
	ref, gen := p.ref, p.gen
	p.mu.Unlock()
	return p.w.connectIn(ctx, ref, gen, stdout, stderr)
}

// follow writes the process's events to stdout and stderr until it exits or
// the stream ends. ok says that stream.Msg holds an event not yet handled.
func (p *Process) follow(stream *connect.ServerStreamForClient[datav1.ProcessEvent], ok bool, stdout, stderr io.Writer) {
	defer stream.Close()
	if !ok {
		ok = stream.Receive()
	}
	for ; ok; ok = stream.Receive() {
		var err error
		switch ev := stream.Msg().GetEvent().(type) {
		case *datav1.ProcessEvent_Started_:
			p.mu.Lock()
			p.ref = startedRef(ev.Started) // a tag may name another process later
			p.pid = p.ref.pid
			p.mu.Unlock()
		case *datav1.ProcessEvent_Stdout:
			err = write(stdout, ev.Stdout, "stdout")
		case *datav1.ProcessEvent_Pty:
			err = write(stdout, ev.Pty, "stdout")
		case *datav1.ProcessEvent_Stderr:
			err = write(stderr, ev.Stderr, "stderr")
		case *datav1.ProcessEvent_Exited_:
			p.finish(ExitStatus{Code: int(ev.Exited.GetExitCode()), Signal: ev.Exited.GetSignal()}, nil)
			return
		}
		if err != nil {
			p.finish(ExitStatus{}, err)
			return
		}
	}
	err := stream.Err()
	if err == nil {
		p.mu.Lock()
		ref := p.ref
		p.mu.Unlock()
		err = fmt.Errorf("the stream of %s ended before it exited", ref)
	}
	p.finish(ExitStatus{}, err)
}

func write(w io.Writer, b []byte, name string) error {
	if w == nil {
		return nil
	}
	if _, err := w.Write(b); err != nil {
		return &OutputError{Stream: name, Err: err}
	}
	return nil
}

// finish records how the stream ended and releases Wait.
func (p *Process) finish(status ExitStatus, err error) {
	p.mu.Lock()
	if err != nil && p.closed {
		err = ErrDetached
	}
	p.status, p.err = status, err
	p.mu.Unlock()
	p.cancel()
	close(p.done)
}

// forwardInput sends r to the process's input, then closes it. It stops
// when ctx ends, which is when the process's stream does. Only a failure
// to read r is reported (by Wait): a failure to send means the process no
// longer reads.
func (p *Process) forwardInput(ctx context.Context, r io.Reader) {
	buf := make([]byte, inputChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if p.SendInput(ctx, buf[:n]) != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() == nil {
				p.mu.Lock()
				p.inputErr = fmt.Errorf("reading stdin: %w", err)
				p.mu.Unlock()
			}
			break
		}
	}
	if ctx.Err() == nil {
		_ = p.CloseInput(ctx)
	}
}
