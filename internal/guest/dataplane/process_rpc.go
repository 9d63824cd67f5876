package dataplane

import (
	"cmp"
	"context"
	"errors"
	"os"
	"slices"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// StartProcess implements ProcessService.StartProcess: started, then the
// output in order, then exited. The process keeps running when the call
// ends first.
func (s *ProcessService) StartProcess(ctx context.Context, req *connect.Request[datav1.StartProcessRequest], stream *connect.ServerStream[datav1.ProcessEvent]) error {
	p, cur, err := s.start(req.Msg)
	if err != nil {
		return err
	}
	defer p.out.detach(cur)
	err = stream.Send(s.startedEvent(p))
	if err == nil {
		err = follow(ctx, p.out, cur, stream) // nil once the exit is sent
	} else {
		err = toConnect(stageStreamingProcess, err)
	}
	if err != nil && req.Msg.GetEndWithCaller() && !p.ended() {
		// The caller gone, nothing would end the process: a tar fed
		// through SendInput waits for its input for ever. A stream that
		// ended with the exit kills nothing, though the process may not
		// count as ended yet, and its group may hold children.
		unix.Kill(-p.pid, unix.SIGKILL)
	}
	return err
}

// Launch starts a process as StartProcess does, for the agent itself:
// no caller follows its output, which it keeps for ConnectProcess. ended
// is closed once the process has ended. Errors are Connect errors.
func (s *ProcessService) Launch(req *datav1.StartProcessRequest) (ended <-chan struct{}, err error) {
	p, cur, err := s.start(req)
	if err != nil {
		return nil, err
	}
	p.out.detach(cur)
	return p.done, nil
}

// ConnectProcess implements ProcessService.ConnectProcess: started, which
// names the process found (by tag, the caller learns its pid), then the
// buffered output, new output and the exit.
func (s *ProcessService) ConnectProcess(ctx context.Context, req *connect.Request[datav1.ConnectProcessRequest], stream *connect.ServerStream[datav1.ProcessEvent]) error {
	p, err := s.lookup(req.Msg.GetProcess(), stageStreamingProcess)
	if err != nil {
		return err
	}
	cur := p.out.attach()
	defer p.out.detach(cur)
	if err := stream.Send(s.startedEvent(p)); err != nil {
		return toConnect(stageStreamingProcess, err)
	}
	return follow(ctx, p.out, cur, stream)
}

// startedEvent is the first event of a process's stream.
func (s *ProcessService) startedEvent(p *process) *datav1.ProcessEvent {
	return &datav1.ProcessEvent{Event: &datav1.ProcessEvent_Started_{
		Started: &datav1.ProcessEvent_Started{Pid: int32(p.pid), BootId: s.bootID},
	}}
}

// follow sends the log's events from cur on, until the exit.
func follow(ctx context.Context, out *outLog, cur *cursor, stream *connect.ServerStream[datav1.ProcessEvent]) error {
	for {
		kind, data, exit, err := out.next(ctx, cur)
		if err != nil {
			return toConnect(stageStreamingProcess, err)
		}
		ev := &datav1.ProcessEvent{}
		switch {
		case exit != nil:
			ev.Event = &datav1.ProcessEvent_Exited_{Exited: exit}
		case kind == outStdout:
			ev.Event = &datav1.ProcessEvent_Stdout{Stdout: data}
		case kind == outStderr:
			ev.Event = &datav1.ProcessEvent_Stderr{Stderr: data}
		default:
			ev.Event = &datav1.ProcessEvent_Pty{Pty: data}
		}
		if err := stream.Send(ev); err != nil {
			return toConnect(stageStreamingProcess, err)
		}
		if exit != nil {
			return nil
		}
	}
}

// ListProcesses implements ProcessService.ListProcesses: the running
// processes by start time, then the last ended ones in the order they
// ended.
func (s *ProcessService) ListProcesses(ctx context.Context, req *connect.Request[datav1.ListProcessesRequest]) (*connect.Response[datav1.ListProcessesResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	running := make([]*process, 0, len(s.running))
	for _, p := range s.running {
		running = append(running, p)
	}
	slices.SortFunc(running, func(a, b *process) int {
		return cmp.Or(a.startedAt.Compare(b.startedAt), cmp.Compare(a.pid, b.pid))
	})
	resp := &datav1.ListProcessesResponse{}
	info := func(p *process, exited *datav1.ProcessEvent_Exited) *datav1.ProcessInfo {
		return &datav1.ProcessInfo{
			Pid:       int32(p.pid),
			Tag:       p.tag,
			Args:      p.args,
			User:      p.user,
			Pty:       p.master != nil,
			StartedAt: timestamppb.New(p.startedAt),
			Exited:    exited,
		}
	}
	for _, p := range running {
		resp.Processes = append(resp.Processes, info(p, nil))
	}
	for _, p := range s.ended {
		resp.Processes = append(resp.Processes, info(p, p.exited))
	}
	return connect.NewResponse(resp), nil
}

// SendInput implements ProcessService.SendInput. It blocks while the pipe
// or terminal is full, until the call's deadline.
func (s *ProcessService) SendInput(ctx context.Context, req *connect.Request[datav1.SendInputRequest]) (*connect.Response[datav1.SendInputResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess(), stageUsingProcess)
	if err != nil {
		return nil, err
	}
	if err := p.write(ctx, req.Msg.GetData()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&datav1.SendInputResponse{}), nil
}

// write writes data to the process's input.
func (p *process) write(ctx context.Context, data []byte) error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if err := p.inputUsable(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { p.in.SetWriteDeadline(time.Unix(1, 0)) })
	n, err := p.in.Write(data)
	if n > 0 {
		p.midLine = data[n-1] != '\n' && data[n-1] != '\r' && data[n-1] != 4
	}
	if !stop() {
		p.in.SetWriteDeadline(time.Time{})
		if err != nil && ctx.Err() != nil {
			return toConnect(stageUsingProcess, ctx.Err())
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EPIPE):
		return newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d closed its input", p.pid)
	case errors.Is(err, os.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, syscall.EIO):
		return newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d has ended", p.pid)
	}
	return toConnect(stageUsingProcess, err)
}

// inputUsable checks that SendInput may write; p.inMu must be held.
func (p *process) inputUsable() error {
	switch {
	case p.ended():
		return newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d has ended", p.pid)
	case p.in == nil:
		return newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d was started without stdin", p.pid)
	case p.inClosed:
		return newError(connect.CodeFailedPrecondition, stageUsingProcess, "the input of process %d is closed", p.pid)
	}
	return nil
}

// CloseInput implements ProcessService.CloseInput. On pipes it closes
// stdin, and closing it again succeeds; on a PTY, which stays open for
// output, it sends the terminal's end-of-file character (Ctrl-D), twice
// after a partial line.
func (s *ProcessService) CloseInput(ctx context.Context, req *connect.Request[datav1.CloseInputRequest]) (*connect.Response[datav1.CloseInputResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess(), stageUsingProcess)
	if err != nil {
		return nil, err
	}
	if p.master != nil {
		// Mid-line, a terminal's Ctrl-D hands the partial line over; only
		// a second, on an empty line, is the end of input.
		eof := []byte{4}
		p.inMu.Lock()
		if p.midLine {
			eof = []byte{4, 4}
		}
		p.inMu.Unlock()
		if err := p.write(ctx, eof); err != nil {
			return nil, err
		}
		return connect.NewResponse(&datav1.CloseInputResponse{}), nil
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.in == nil {
		return nil, newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d was started without stdin", p.pid)
	}
	if !p.inClosed {
		p.in.Close()
		p.inClosed = true
	}
	return connect.NewResponse(&datav1.CloseInputResponse{}), nil
}

// SignalProcess implements ProcessService.SignalProcess: the signal goes
// to the process's group, which is the process's pid.
func (s *ProcessService) SignalProcess(ctx context.Context, req *connect.Request[datav1.SignalProcessRequest]) (*connect.Response[datav1.SignalProcessResponse], error) {
	sig, ok := parseSignal(req.Msg.GetSignal())
	if !ok {
		return nil, newError(connect.CodeInvalidArgument, stageUsingProcess, "signal %q is not a signal name (TERM, SIGKILL, ...) or number", req.Msg.GetSignal())
	}
	p, err := s.lookup(req.Msg.GetProcess(), stageUsingProcess)
	if err != nil {
		return nil, err
	}
	// The group outlives its leader while members remain (a command's
	// background children), and killing a command kills its children; its
	// ID is not reused while it has members. ESRCH means that no one is
	// left: for a running leader, its exit is on its way.
	err = unix.Kill(-p.pid, sig)
	switch {
	case errors.Is(err, unix.ESRCH) && p.ended():
		return nil, newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d and every process of its group have ended", p.pid)
	case err != nil && !errors.Is(err, unix.ESRCH):
		return nil, toConnect(stageUsingProcess, err)
	}
	return connect.NewResponse(&datav1.SignalProcessResponse{}), nil
}

// ResizeTerminal implements ProcessService.ResizeTerminal.
func (s *ProcessService) ResizeTerminal(ctx context.Context, req *connect.Request[datav1.ResizeTerminalRequest]) (*connect.Response[datav1.ResizeTerminalResponse], error) {
	size := req.Msg.GetSize()
	if size.GetCols() == 0 || size.GetRows() == 0 || size.GetCols() > 0xffff || size.GetRows() > 0xffff {
		return nil, newError(connect.CodeInvalidArgument, stageUsingProcess, "size: cols and rows must be 1 to 65535")
	}
	p, err := s.lookup(req.Msg.GetProcess(), stageUsingProcess)
	if err != nil {
		return nil, err
	}
	if p.master == nil {
		return nil, newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d has no terminal", p.pid)
	}
	if p.ended() {
		return nil, newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d has ended", p.pid)
	}
	rc, err := p.master.SyscallConn()
	if err == nil {
		ws := &unix.Winsize{Col: uint16(size.GetCols()), Row: uint16(size.GetRows())}
		cerr := rc.Control(func(fd uintptr) { err = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws) })
		if cerr != nil {
			err = cerr
		}
	}
	if errors.Is(err, os.ErrClosed) {
		return nil, newError(connect.CodeFailedPrecondition, stageUsingProcess, "process %d has ended", p.pid)
	} else if err != nil {
		return nil, toConnect(stageUsingProcess, err)
	}
	return connect.NewResponse(&datav1.ResizeTerminalResponse{}), nil
}
