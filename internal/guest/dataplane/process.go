package dataplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
)

const (
	// DefaultOutputLimit is the output a process keeps for ConnectProcess.
	DefaultOutputLimit = 1 << 20
	// maxEnded is how many ended processes ListProcesses and
	// ConnectProcess still know.
	maxEnded = 100
	// endedOutputBudget bounds the output kept for all ended processes
	// together; the oldest lose theirs first.
	endedOutputBudget = 8 << 20
	// drainDelay is how long, after a process ended, its output may stay
	// open (held by a child it left behind) before the stream is cut.
	drainDelay = 2 * time.Second
	// defaultPath is PATH when the guest's environment has none.
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// ProcessConfig configures a ProcessService.
type ProcessConfig struct {
	// Waiter starts the children and reports their exits (required).
	Waiter Waiter
	// Accounts resolves user names; nil reads /etc/passwd and /etc/group.
	Accounts *Accounts
	// Env is the guest's environment that a process's env is merged
	// over; nil is the agent's own.
	Env []string
	// OutputLimit bounds the output buffered per process; 0 is
	// DefaultOutputLimit.
	OutputLimit int
	// Logf, if set, receives diagnostics.
	Logf func(format string, args ...any)
}

// ProcessService implements kibotos.data.v1.ProcessService. Its
// processes outlive the calls that started them; Terminate or the
// guest's TerminateAll ends them.
type ProcessService struct {
	datav1connect.UnimplementedProcessServiceHandler

	waiter      Waiter
	accounts    *Accounts
	env         []string
	outputLimit int
	logf        func(format string, args ...any)

	mu      sync.Mutex
	running map[int]*process
	tags    map[string]*process // tags of running and starting processes
	ended   []*process          // the most recently ended, oldest first
}

// NewProcessService returns a ProcessService with no process.
func NewProcessService(cfg ProcessConfig) *ProcessService {
	if cfg.Waiter == nil {
		panic("guest: ProcessConfig.Waiter is required")
	}
	s := &ProcessService{
		waiter:      cfg.Waiter,
		accounts:    cfg.Accounts,
		env:         cfg.Env,
		outputLimit: cfg.OutputLimit,
		logf:        cfg.Logf,
		running:     make(map[int]*process),
		tags:        make(map[string]*process),
	}
	if s.env == nil {
		s.env = os.Environ()
	}
	if s.outputLimit <= 0 {
		s.outputLimit = DefaultOutputLimit
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	return s
}

// process is one process started through StartProcess.
type process struct {
	pid       int // set under ProcessService.mu once started
	tag       string
	args      []string
	user      string
	startedAt time.Time
	out       *outLog

	master  *os.File   // the PTY master; nil on pipes
	outputs []*os.File // stdout and stderr read ends, or the master

	inMu     sync.Mutex
	in       *os.File // stdin's write end or the master; nil without input
	inClosed bool

	exitCh chan struct{} // closed when the wait status arrived
	status unix.WaitStatus
	done   chan struct{} // closed once exited is set and the output ended
	exited *datav1.ProcessEvent_Exited
}

// ended reports whether the process's exit has been reported.
func (p *process) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// start validates req, starts the process and returns it with a reader
// attached at its first byte of output. Errors are Connect errors.
func (s *ProcessService) start(req *datav1.StartProcessRequest) (*process, *cursor, error) {
	invalid := func(format string, args ...any) error {
		return newError(connect.CodeInvalidArgument, stageStartingProcess, format, args...)
	}
	args := req.GetArgs()
	if len(args) == 0 || args[0] == "" {
		return nil, nil, invalid("args: the program, args[0], is required")
	}
	for i, a := range args {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, nil, invalid("args[%d] contains a NUL byte", i)
		}
	}
	if strings.IndexByte(req.GetCwd(), 0) >= 0 {
		return nil, nil, invalid("cwd contains a NUL byte")
	}
	var cols, rows uint16
	if t := req.GetPty(); t != nil {
		if t.Cols > 0xffff || t.Rows > 0xffff {
			return nil, nil, invalid("pty: %dx%d is too large", t.Cols, t.Rows)
		}
		cols, rows = uint16(t.Cols), uint16(t.Rows)
		if cols == 0 {
			cols = 80
		}
		if rows == 0 {
			rows = 24
		}
	}
	u, err := s.accounts.Lookup(req.GetUser())
	if errors.Is(err, errUnknownUser) {
		return nil, nil, invalid("user: %v", err)
	} else if err != nil {
		return nil, nil, toConnect(stageStartingProcess, err)
	}
	env, err := buildEnv(s.env, u, req.GetEnv(), req.GetPty() != nil)
	if err != nil {
		return nil, nil, invalid("env: %v", err)
	}
	cwd := req.GetCwd()
	switch {
	case cwd == "":
		cwd = u.Home
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			cwd = "/"
		}
	case !filepath.IsAbs(cwd):
		cwd = filepath.Join(u.Home, cwd)
	}
	path, err := lookPath(args[0], envValue(env, "PATH"), cwd)
	if err != nil {
		return nil, nil, toConnect(stageStartingProcess, err)
	}

	p := &process{
		tag:       req.GetTag(),
		args:      slices.Clone(args),
		user:      u.Name,
		startedAt: time.Now(),
		out:       newOutLog(s.outputLimit),
		exitCh:    make(chan struct{}),
		done:      make(chan struct{}),
	}
	if p.tag != "" {
		s.mu.Lock()
		if _, taken := s.tags[p.tag]; taken {
			s.mu.Unlock()
			return nil, nil, newError(connect.CodeAlreadyExists, stageStartingProcess, "tag %q names a running process", p.tag)
		}
		s.tags[p.tag] = p // reserved; p.pid == 0 until started
		s.mu.Unlock()
	}
	started := false
	var childFiles []*os.File // the child's ends, closed here after the fork
	defer func() {
		for _, f := range childFiles {
			f.Close()
		}
		if started {
			return
		}
		for _, f := range append(p.outputs, p.in) {
			if f != nil {
				f.Close()
			}
		}
		if p.tag != "" {
			s.mu.Lock()
			delete(s.tags, p.tag)
			s.mu.Unlock()
		}
	}()

	sys := &syscall.SysProcAttr{}
	if euid := os.Geteuid(); euid == 0 || int(u.UID) != euid {
		sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	var stdio [3]*os.File
	if req.GetPty() != nil {
		master, tty, err := openPty(cols, rows)
		if err != nil {
			return nil, nil, toConnect(stageStartingProcess, fmt.Errorf("open pty: %w", err))
		}
		childFiles = append(childFiles, tty)
		stdio = [3]*os.File{tty, tty, tty}
		p.master, p.in, p.outputs = master, master, []*os.File{master}
		// A session of its own, with the PTY as controlling terminal; the
		// process leads its process group too.
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		if req.GetStdin() {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, nil, toConnect(stageStartingProcess, err)
			}
			childFiles = append(childFiles, r)
			stdio[0], p.in = r, w
		} else {
			null, err := os.Open(os.DevNull)
			if err != nil {
				return nil, nil, toConnect(stageStartingProcess, err)
			}
			childFiles = append(childFiles, null)
			stdio[0] = null
		}
		for i := 1; i <= 2; i++ {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, nil, toConnect(stageStartingProcess, err)
			}
			childFiles = append(childFiles, w)
			p.outputs = append(p.outputs, r)
			stdio[i] = w
		}
		sys.Setpgid = true
	}
	// Fd puts the child's ends in blocking mode, as a child expects.
	files := []uintptr{stdio[0].Fd(), stdio[1].Fd(), stdio[2].Fd()}
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Files: files, Sys: sys}

	cur := p.out.attach()
	pid, err := s.waiter.Spawn(func() (int, error) {
		return forkExec(path, args, attr)
	}, func(ws unix.WaitStatus) {
		p.status = ws
		close(p.exitCh)
	})
	if err != nil {
		p.out.detach(cur)
		return nil, nil, toConnect(stageStartingProcess, fmt.Errorf("start %s in %s: %w", args[0], cwd, err))
	}
	started = true
	s.mu.Lock()
	p.pid = pid
	s.running[pid] = p
	s.mu.Unlock()
	go s.run(p)
	return p, cur, nil
}

// run copies the process's output into its log until the process ended
// and its output reached EOF, then reports the exit.
func (s *ProcessService) run(p *process) {
	var wg sync.WaitGroup
	for i, f := range p.outputs {
		kind := outStdout
		switch {
		case p.master != nil:
			kind = outPty
		case i == 1:
			kind = outStderr
		}
		wg.Go(func() { pump(f, kind, p.out) })
	}
	pumped := make(chan struct{})
	go func() {
		wg.Wait()
		close(pumped)
	}()

	<-p.exitCh
	timer := time.NewTimer(drainDelay)
	defer timer.Stop()
wait:
	for {
		select {
		case <-pumped:
			break wait
		case <-timer.C:
			if p.out.writerWaiting() {
				// Slow readers, not a lingering child, hold the output up.
				timer.Reset(drainDelay)
				continue
			}
			// A child the process left behind holds its output open.
			for _, f := range p.outputs {
				f.Close()
			}
			<-pumped
			break wait
		}
	}
	p.exited = exitEvent(p.status)
	p.closeInput()
	for _, f := range p.outputs {
		f.Close()
	}
	p.out.close(p.exited)
	s.retire(p)
	close(p.done)
}

// pump copies f into out until EOF, an error (EIO: a PTY whose other side
// is gone) or Close.
func pump(f *os.File, kind outKind, out *outLog) {
	buf := make([]byte, maxChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			out.write(kind, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// retire moves an ended process from the running ones to the ended ones.
func (s *ProcessService) retire(p *process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[p.pid] == p {
		delete(s.running, p.pid)
	}
	if p.tag != "" && s.tags[p.tag] == p {
		delete(s.tags, p.tag)
	}
	s.ended = append(s.ended, p)
	if n := len(s.ended) - maxEnded; n > 0 {
		clear(s.ended[:n])
		s.ended = s.ended[n:]
	}
	total := 0
	for _, e := range slices.Backward(s.ended) {
		sz := e.out.size()
		if total+sz > endedOutputBudget {
			e.out.discard()
			continue
		}
		total += sz
	}
}

// closeInput closes stdin (or the PTY master), interrupting a SendInput
// that blocks on it.
func (p *process) closeInput() {
	if p.in != nil {
		p.in.SetWriteDeadline(time.Now())
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.in != nil && !p.inClosed {
		p.in.Close()
		p.inClosed = true
	}
}

// lookup finds a running process, or else the most recent ended one, by
// pid or tag.
func (s *ProcessService) lookup(sel *datav1.ProcessSelector, stage stageT) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *datav1.ProcessSelector_Pid:
		if v.Pid <= 0 {
			return nil, newError(connect.CodeInvalidArgument, stage, "process.pid must be positive")
		}
		if p, ok := s.running[int(v.Pid)]; ok {
			return p, nil
		}
		for _, p := range slices.Backward(s.ended) {
			if p.pid == int(v.Pid) {
				return p, nil
			}
		}
		return nil, newError(connect.CodeNotFound, stage, "no process with pid %d", v.Pid)
	case *datav1.ProcessSelector_Tag:
		if v.Tag == "" {
			return nil, newError(connect.CodeInvalidArgument, stage, "process.tag is empty")
		}
		if p := s.tags[v.Tag]; p != nil && p.pid != 0 {
			return p, nil
		}
		for _, p := range slices.Backward(s.ended) {
			if p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, newError(connect.CodeNotFound, stage, "no process with tag %q", v.Tag)
	}
	return nil, newError(connect.CodeInvalidArgument, stage, "process: a pid or a tag is required")
}

// Wait blocks until every process has ended and reported its exit, or ctx
// ends.
func (s *ProcessService) Wait(ctx context.Context) error {
	for {
		s.mu.Lock()
		var p *process
		for _, q := range s.running {
			p = q
			break
		}
		s.mu.Unlock()
		if p == nil {
			return nil
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Terminate ends every running process: SIGTERM to each process group,
// up to grace for them to end, then SIGKILL and up to 5 s more. It is for
// an agent that is not PID 1 (PID 1 ends every process of the guest).
func (s *ProcessService) Terminate(grace time.Duration) error {
	signalAll := func(sig unix.Signal) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for pid := range s.running {
			unix.Kill(-pid, sig)
		}
	}
	signalAll(unix.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if s.Wait(ctx) == nil {
		return nil
	}
	signalAll(unix.SIGKILL)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Wait(ctx); err != nil {
		return fmt.Errorf("guest: processes did not end after SIGKILL: %w", err)
	}
	return nil
}
