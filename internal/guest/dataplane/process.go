package dataplane

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
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

	// bootID names this service's life (Started.boot_id): a reset of the
	// guest makes another.
	bootID string

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
		bootID:      rand.Text(),
		waiter:      cfg.Waiter,
		accounts:    cmp.Or(cfg.Accounts, &Accounts{}),
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
	// outputOrphaned is set once the exit is reported while children the
	// process left behind hold its output open: their output is dropped.
	outputOrphaned atomic.Bool

	inMu     sync.Mutex
	in       *os.File // stdin's write end or the master; nil without input
	inClosed bool
	midLine  bool // the last byte written to the master ended no line

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
		wg.Go(func() { pump(f, kind, p.out, &p.outputOrphaned) })
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
			// A child the process left behind holds its output open: the
			// exit is reported, and what the child writes from now on is
			// read and dropped, so that its writes neither fail (closing
			// the pipe would kill it with SIGPIPE) nor block.
			p.outputOrphaned.Store(true)
			break wait
		}
	}
	p.exited = exitEvent(p.status)
	p.closeInput()
	p.out.close(p.exited)
	s.retire(p)
	close(p.done)
}

// pump copies f into out until EOF or an error (EIO: a PTY whose other
// side is gone), then closes f; once orphaned is set it drops what it
// reads.
func pump(f *os.File, kind outKind, out *outLog, orphaned *atomic.Bool) {
	defer f.Close()
	buf := pumpBuffers.Get().(*[maxChunk]byte)
	defer pumpBuffers.Put(buf)
	for {
		n, err := f.Read(buf[:])
		if n > 0 && !orphaned.Load() {
			out.write(kind, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// pumpBuffers recycles pump's read buffers between processes. A buffer
// made in pump stayed on its goroutine's stack, which then grew from its
// first few KiB to hold it: a copy of the stack and 32 KiB zeroed for every
// output of every process, and two stacks of 64 KiB held for as long as a
// process runs.
var pumpBuffers = sync.Pool{New: func() any { return new([maxChunk]byte) }}

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
// pid or tag, of this boot of the guest when the selector names one.
func (s *ProcessService) lookup(sel *datav1.ProcessSelector, stage stageT) (*process, error) {
	if boot := sel.GetBootId(); boot != "" && boot != s.bootID {
		return nil, newError(connect.CodeNotFound, stage, "%s was of an earlier boot of the guest, which was reset since", describeSelector(sel))
	}
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

// describeSelector names the process sel selects.
func describeSelector(sel *datav1.ProcessSelector) string {
	if tag := sel.GetTag(); tag != "" {
		return fmt.Sprintf("the process with tag %q", tag)
	}
	return fmt.Sprintf("process %d", sel.GetPid())
}
