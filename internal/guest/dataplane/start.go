package dataplane

import (
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
	"github.com/kibotos/kibotos/internal/guest/execshim"
)

// start validates req, starts the process and returns it with a reader
// attached at its first byte of output. Errors are Connect errors.
func (s *ProcessService) start(req *datav1.StartProcessRequest) (*process, *cursor, error) {
	if err := checkStart(req); err != nil {
		return nil, nil, err
	}
	u, err := s.accounts.Lookup(req.GetUser())
	if errors.Is(err, errUnknownUser) {
		return nil, nil, invalidStart("user: %v", err)
	} else if err != nil {
		return nil, nil, toConnect(stageStartingProcess, err)
	}
	prog, err := s.program(req, u)
	if err != nil {
		return nil, nil, err
	}
	p := &process{
		tag:       req.GetTag(),
		args:      prog.args,
		user:      u.Name,
		startedAt: time.Now(),
		out:       newOutLog(s.outputLimit),
		exitCh:    make(chan struct{}),
		done:      make(chan struct{}),
	}
	if err := s.reserveTag(p); err != nil {
		return nil, nil, err
	}
	std, err := openStdio(req)
	if err != nil {
		s.releaseTag(p)
		return nil, nil, toConnect(stageStartingProcess, err)
	}
	defer std.closeChildEnds() // the child has its own copies
	std.sys.Credential = credential(u)
	attr := &syscall.ProcAttr{Dir: prog.cwd, Env: prog.env, Files: std.childFds(), Sys: std.sys}

	cur := p.out.attach()
	var started func() error
	pid, err := s.waiter.Spawn(func() (int, error) {
		pid, st, err := execshim.ForkExec(prog.path, prog.args, attr)
		started = st
		return pid, err
	}, func(ws unix.WaitStatus) {
		p.status = ws
		close(p.exitCh)
	})
	if err == nil {
		// Outside the waiter's lock; a child that could not exec its
		// program exits, and its exit reaches p, which is dropped.
		err = started()
	}
	if err != nil {
		p.out.detach(cur)
		std.closeAgentEnds()
		s.releaseTag(p)
		return nil, nil, toConnect(stageStartingProcess, fmt.Errorf("start %s in %s: %w", prog.args[0], prog.cwd, err))
	}
	p.master, p.in, p.outputs = std.master, std.in, std.outputs
	s.mu.Lock()
	p.pid = pid
	s.running[pid] = p
	s.mu.Unlock()
	go s.run(p)
	return p, cur, nil
}

// invalidStart is an invalid_argument error of starting a process.
func invalidStart(format string, args ...any) error {
	return newError(connect.CodeInvalidArgument, stageStartingProcess, format, args...)
}

// checkStart checks what of req needs no lookup: args, cwd and the PTY.
func checkStart(req *datav1.StartProcessRequest) error {
	args := req.GetArgs()
	if len(args) == 0 || args[0] == "" {
		return invalidStart("args: the program, args[0], is required")
	}
	for i, a := range args {
		if strings.IndexByte(a, 0) >= 0 {
			return invalidStart("args[%d] contains a NUL byte", i)
		}
	}
	if strings.IndexByte(req.GetCwd(), 0) >= 0 {
		return invalidStart("cwd contains a NUL byte")
	}
	if t := req.GetPty(); t != nil && (t.Cols > 0xffff || t.Rows > 0xffff) {
		return invalidStart("pty: %dx%d is too large", t.Cols, t.Rows)
	}
	return nil
}

// program is what a process execs: the file found, argv, environment and
// working directory.
type program struct {
	path string
	args []string
	env  []string
	cwd  string
}

// program resolves the environment, working directory and program file
// of req for u.
func (s *ProcessService) program(req *datav1.StartProcessRequest, u *User) (*program, error) {
	env, err := buildEnv(s.env, u, req.GetEnv(), req.GetPty() != nil)
	if err != nil {
		return nil, invalidStart("env: %v", err)
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
	if req.GetCwd() != "" {
		// Checked here: the child's chdir would fail as a missing program
		// does (ENOENT, not_found), which callers take for "command not
		// found".
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			return nil, newError(connect.CodeFailedPrecondition, stageStartingProcess, "cwd %s is not a directory of the workspace", cwd)
		}
	}
	args := slices.Clone(req.GetArgs())
	path, err := lookPath(args[0], envValue(env, "PATH"), cwd)
	if err != nil {
		return nil, toConnect(stageStartingProcess, err)
	}
	return &program{path: path, args: args, env: env, cwd: cwd}, nil
}

// credential returns the identity a process of u runs with; nil keeps
// the agent's, when the agent is not root and is u already.
func credential(u *User) *syscall.Credential {
	if euid := os.Geteuid(); euid != 0 && int(u.UID) == euid {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

// reserveTag claims p's tag, if it has one, for p; p.pid is 0 until it
// started.
func (s *ProcessService) reserveTag(p *process) error {
	if p.tag == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, taken := s.tags[p.tag]; taken {
		return newError(connect.CodeAlreadyExists, stageStartingProcess, "tag %q names a running process", p.tag)
	}
	s.tags[p.tag] = p
	return nil
}

// releaseTag gives up the tag of a process that did not start.
func (s *ProcessService) releaseTag(p *process) {
	if p.tag == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tags, p.tag)
}

// stdio is a process's standard streams before it starts: the child's
// ends and the agent's.
type stdio struct {
	child     [3]*os.File // stdin, stdout, stderr of the child
	childEnds []*os.File  // the distinct files of child but the shared /dev/null, which the agent closes once the child has them
	master    *os.File    // the PTY master; nil on pipes
	in        *os.File    // stdin's write end or the master; nil without input
	outputs   []*os.File  // stdout's and stderr's read ends, or the master
	sys       *syscall.SysProcAttr
}

// openStdio opens req's PTY, or else its pipes.
func openStdio(req *datav1.StartProcessRequest) (*stdio, error) {
	if t := req.GetPty(); t != nil {
		cols, rows := uint16(t.Cols), uint16(t.Rows)
		if cols == 0 {
			cols = 80
		}
		if rows == 0 {
			rows = 24
		}
		return openTerminal(cols, rows)
	}
	return openPipes(req.GetStdin())
}

// openTerminal opens a PTY of the size as the controlling terminal of a
// session of the process's own, which it leads, its process group too.
func openTerminal(cols, rows uint16) (*stdio, error) {
	master, tty, err := openPty(cols, rows)
	if err != nil {
		return nil, fmt.Errorf("open pty: %w", err)
	}
	return &stdio{
		child: [3]*os.File{tty, tty, tty}, childEnds: []*os.File{tty},
		master: master, in: master, outputs: []*os.File{master},
		sys: &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
	}, nil
}

// openPipes opens a pipe for stdout and one for stderr, and for stdin one
// with input or else /dev/null. The process leads a process group of its
// own.
func openPipes(input bool) (_ *stdio, err error) {
	std := &stdio{sys: &syscall.SysProcAttr{Setpgid: true}}
	defer func() {
		if err != nil {
			std.closeChildEnds()
			std.closeAgentEnds()
		}
	}()
	if input {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		std.child[0], std.in = r, w
	} else if std.child[0], err = devNull(); err != nil {
		return nil, err
	}
	if input {
		std.childEnds = append(std.childEnds, std.child[0])
	}
	for i := 1; i <= 2; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		std.child[i] = w
		std.childEnds = append(std.childEnds, w)
		std.outputs = append(std.outputs, r)
	}
	return std, nil
}

// devNull is /dev/null, opened once, the stdin of every process started
// without input: each child gets its own copy of the descriptor.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })

// childFds returns the child's descriptors. Fd puts them in blocking
// mode, as a child expects.
func (std *stdio) childFds() []uintptr {
	return []uintptr{std.child[0].Fd(), std.child[1].Fd(), std.child[2].Fd()}
}

// closeChildEnds closes the child's ends.
func (std *stdio) closeChildEnds() {
	for _, f := range std.childEnds {
		f.Close()
	}
}

// closeAgentEnds closes the agent's ends, of a process that did not
// start.
func (std *stdio) closeAgentEnds() {
	for _, f := range append(std.outputs, std.in) {
		if f != nil {
			f.Close()
		}
	}
}
