package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/sdk"
)

// ExitError is what a verb returns to make the command exit with Code
// without printing an error, as `ws exec` does with the remote command's
// status.
type ExitError struct {
	Code int
}

func (e *ExitError) Error() string { return "exit status " + strconv.Itoa(e.Code) }

// ExitCode returns Code.
func (e *ExitError) ExitCode() int { return e.Code }

// exitCode is the status a shell reports for a command that ended so:
// its exit code, or 128 plus the number of the signal that killed it.
func exitCode(s sdk.ExitStatus) int {
	if s.Signal == "" {
		return s.Code
	}
	name := strings.ToUpper(s.Signal)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if n := unix.SignalNum(name); n != 0 {
		return 128 + int(n)
	}
	// A signal with no name (real-time ones) is named by its number.
	if n, err := strconv.Atoi(strings.TrimPrefix(name, "SIG")); err == nil && n >= 1 && n <= 64 {
		return 128 + n
	}
	return 255
}

// defaultPTY is the terminal size when stdout is not a terminal.
var defaultPTY = sdk.PTYSize{Cols: 80, Rows: 24}

// signalGrace bounds the call that sends a signal to an exec's command.
const signalGrace = 5 * time.Second

// signalRemote sends the command sig, and returns nil once sent: the
// command's exit, when it comes, ends the exec as any exit does. A signal
// that could not be sent is the error to end the exec with.
func signalRemote(ctx context.Context, p *sdk.Process, sig string) error {
	sctx, cancel := context.WithTimeout(ctx, signalGrace)
	defer cancel()
	if err := p.Signal(sctx, sig); err != nil {
		return fmt.Errorf("sending %s to pid %d failed: %w", sig, p.Pid(), err)
	}
	return nil
}

// onInterrupts calls first when ctx ends (the CLI's SIGINT, SIGTERM or
// SIGHUP), then again when another arrives; stop ends the watch.
func onInterrupts(ctx context.Context, first, again func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, interruptSignals...)
		defer signal.Stop(ch)
		first()
		select {
		case <-done:
		case <-ch:
			again()
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}

// startFailureCode is the exit status a shell gives a command it could
// not start: 127 when the program is not found, 126 when it may not be
// run.
func startFailureCode(err error) (int, bool) {
	f, ok := sdk.FailureOf(err)
	if !ok || f.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_STARTING_PROCESS {
		return 0, false
	}
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return 127, true
	case connect.CodePermissionDenied:
		return 126, true
	}
	return 0, false
}

func wsExecCommand(c *conn) *cobra.Command {
	var (
		interactive, tty bool
		user, cwd, tag   string
		env              []string
		detach           bool
		timeout          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec [-i] [-t] [--detach] [--timeout D] [--user NAME] [--cwd DIR] [--env K=V ...] ID -- COMMAND [ARG...]",
		Short: "Run a command in a Workspace and exit with its exit code",
		Long: "Run COMMAND in the Workspace, looked up in its PATH, and stream its output here. The\n" +
			"command exits with the remote command's exit code, or 128 plus the signal's number when a\n" +
			"signal ended it.\n\n" +
			"-i forwards stdin to the command and closes its input at EOF. -t runs it on a\n" +
			"pseudo-terminal the size of this one; with -i on a terminal, that terminal is put in raw\n" +
			"mode, so keys such as Ctrl-C go to the remote command. Interrupting exec otherwise sends\n" +
			"the command SIGTERM and waits for its exit (interrupt again to leave it running); output that\n" +
			"can no longer be written here (a reader that left) ends it too (SIGPIPE, exit 141). --timeout\n" +
			"kills the command (SIGKILL) when it runs longer: exec then exits 137. A command that is not\n" +
			"found exits 127, one that may not be run 126, as in a shell. --detach\n" +
			"starts the command, prints its pid and returns, leaving it running (see `ws ps`, `ws logs`).\n" +
			"Put -- before the command when it has flags of its own.",
		Args: cobra.MinimumNArgs(2),
	}
	f := cmd.Flags()
	f.BoolVarP(&interactive, "stdin", "i", false, "forward stdin to the command")
	f.BoolVarP(&tty, "tty", "t", false, "run the command on a pseudo-terminal")
	f.StringVar(&user, "user", "", "user of the guest to run as (default: root)")
	f.StringVar(&cwd, "cwd", "", "working directory (default: the user's home directory)")
	f.StringVar(&tag, "tag", "", "name the process for `ws logs`; unique among running processes")
	f.StringArrayVar(&env, "env", nil, "environment variable K=V (repeatable)")
	f.BoolVarP(&detach, "detach", "d", false, "start the command, print its pid and leave it running")
	f.DurationVar(&timeout, "timeout", 0, "kill the command when it runs longer than this (0: no limit)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		vars, err := parsePairs("--env", env)
		if err != nil {
			return err
		}
		if detach && (interactive || tty || timeout != 0) {
			return errors.New("--detach takes neither -i, -t nor --timeout")
		}
		if timeout < 0 {
			return fmt.Errorf("--timeout %s: want a positive duration", timeout)
		}
		ws, closeIdle, err := openWorkspace(cmd, c, args[0])
		if err != nil {
			return err
		}
		defer closeIdle()
		// A write to a stdout whose reader left fails with EPIPE rather
		// than killing this process, which then ends the command too
		// (endUnwritable).
		signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
		o := sdk.ExecOptions{Env: vars, Cwd: cwd, User: user, Tag: tag, Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr()}
		if interactive {
			o.Stdin = cmd.InOrStdin()
		}
		var outFd = -1 // of stdout, when it is a terminal
		if tty {
			size := defaultPTY
			if fd, ok := terminalFd(o.Stdout); ok {
				outFd = fd
				if w, h, err := term.GetSize(fd); err == nil {
					size = sdk.PTYSize{Cols: uint16(w), Rows: uint16(h)}
				}
			}
			o.PTY = &size
			if _, set := vars["TERM"]; !set {
				o.Env = withTerm(vars)
			}
			if fd, ok := terminalFd(o.Stdin); ok && interactive {
				state, err := term.MakeRaw(fd)
				if err != nil {
					return fmt.Errorf("putting the terminal in raw mode: %w", err)
				}
				defer term.Restore(fd, state)
			}
		}
		ctx := cmd.Context()
		if detach {
			o.Stdout, o.Stderr = nil, nil
			p, err := ws.Start(ctx, args[1:], o)
			if err != nil {
				return err
			}
			p.Close() // the process goes on
			_, err = fmt.Fprintln(cmd.OutOrStdout(), p.Pid())
			return err
		}
		// The stream outlives an interrupt, which only signals the
		// command: its last output and its exit still come.
		runCtx, endRun := context.WithCancelCause(context.WithoutCancel(ctx))
		defer endRun(nil)
		// An interrupt before the command runs gives up the start.
		startingOnly := context.AfterFunc(ctx, func() { endRun(ctx.Err()) })
		p, err := ws.Start(runCtx, args[1:], o)
		if !startingOnly() && err == nil {
			// Interrupted as the start was answered: the stream went
			// with it, the signal goes still.
			return errors.Join(fmt.Errorf("interrupted as pid %d started; sending it SIGTERM", p.Pid()),
				signalRemote(context.WithoutCancel(ctx), p, "SIGTERM"))
		}
		if err != nil {
			if code, ok := startFailureCode(err); ok {
				fmt.Fprintln(cmd.ErrOrStderr(), "kibotos:", printable(err.Error(), true))
				return &ExitError{Code: code}
			}
			return err
		}
		if timeout > 0 {
			// The limit counts from the command's start: the session and
			// the call that starts it may take a while on a busy host.
			limit := time.AfterFunc(timeout, func() {
				fmt.Fprintf(cmd.ErrOrStderr(), "kibotos: timed out after %s; killing pid %d\n", timeout, p.Pid())
				if err := signalRemote(runCtx, p, "SIGKILL"); err != nil {
					endRun(err)
				}
			})
			defer limit.Stop()
		}
		if outFd >= 0 {
			defer forwardResize(ctx, p, outFd)()
		}
		stopInterrupts := onInterrupts(ctx, func() {
			// A hangup (the terminal closed) reaches the command as one,
			// as a remote shell gets it from ssh; anything else is TERM.
			sig := "SIGTERM"
			if cause := (interrupted{}); errors.As(context.Cause(ctx), &cause) && cause.Signal == syscall.SIGHUP {
				sig = "SIGHUP"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kibotos: interrupted; sending %s to pid %d and waiting for it to exit (interrupt again to leave it)\n", sig, p.Pid())
			if err := signalRemote(runCtx, p, sig); err != nil {
				endRun(err)
			}
			// A stopped command (SIGSTOP, or Ctrl-Z's SIGTSTP) handles
			// the signal only once it runs again.
			_ = signalRemote(runCtx, p, "SIGCONT")
		}, func() {
			endRun(fmt.Errorf("interrupted again; left pid %d to end by itself", p.Pid()))
		})
		defer stopInterrupts()
		status, err := p.Wait()
		if outErr := (*sdk.OutputError)(nil); errors.As(err, &outErr) {
			return endUnwritable(ctx, p, outErr)
		}
		if err != nil {
			if cause := context.Cause(runCtx); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			if ctx.Err() == nil {
				return mayRunOn(err, args[0], p.Pid())
			}
			return err
		}
		if code := exitCode(status); code != 0 {
			return &ExitError{Code: code}
		}
		return nil
	}
	return cmd
}

// mayRunOn adds to the error of an exec whose connection broke
// (unavailable: the server restarted, say) that its command may run on,
// and how to follow it: running it again would run it twice.
func mayRunOn(err error, workspaceID string, pid int) error {
	if connect.CodeOf(err) != connect.CodeUnavailable {
		return err
	}
	return fmt.Errorf("%w; the command may still run as pid %d: follow it with kibotos ws logs -f %s %d", err, pid, workspaceID, pid)
}

// endUnwritable ends an exec whose output can no longer be written here,
// so that the command does not run on unread: a reader that left (a
// broken pipe, as `| head` leaves) gets the command SIGPIPE, as a local
// command in that pipe would get, and exec ends as one killed by it
// (141); any other failure gets it SIGTERM and is the error.
func endUnwritable(ctx context.Context, p *sdk.Process, outErr *sdk.OutputError) error {
	ctx = context.WithoutCancel(ctx)
	if errors.Is(outErr, syscall.EPIPE) {
		if err := signalRemote(ctx, p, "SIGPIPE"); err != nil {
			return errors.Join(outErr, err)
		}
		terminateIfStillRunning(ctx, p, pipeGrace)
		return &ExitError{Code: 128 + int(syscall.SIGPIPE)}
	}
	return errors.Join(fmt.Errorf("%w; sent SIGTERM to pid %d", outErr, p.Pid()), signalRemote(ctx, p, "SIGTERM"))
}

// pipeGrace is how long a command sent SIGPIPE has to end before it gets
// SIGTERM.
const pipeGrace = 2 * time.Second

// terminateIfStillRunning sends the command SIGTERM unless it ends within
// grace: one that ignores SIGPIPE would fail its next write to a local
// pipe whose reader left and end, but its output goes nowhere in the
// workspace, so it would run on for good.
func terminateIfStillRunning(ctx context.Context, p *sdk.Process, grace time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	q, err := p.Connect(wctx, io.Discard, io.Discard)
	if err != nil {
		return // it has ended, or cannot be followed: nothing to end
	}
	defer q.Close()
	if _, err := q.Wait(); err == nil {
		return
	}
	_ = signalRemote(ctx, p, "SIGTERM") // an end meanwhile refuses it
}

// withTerm returns env with TERM set as here, so that the remote terminal
// speaks this one's language.
func withTerm(env map[string]string) map[string]string {
	out := map[string]string{"TERM": "xterm-256color"}
	if t := os.Getenv("TERM"); t != "" {
		out["TERM"] = t
	}
	for k, v := range env {
		out[k] = v
	}
	return out
}

// terminalFd returns the descriptor of v when it is a terminal.
func terminalFd(v any) (int, bool) {
	f, ok := v.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0, false
	}
	return int(f.Fd()), true
}

// forwardResize sends the size of the terminal fd to p's PTY whenever it
// changes (SIGWINCH), until ctx ends or the returned stop is called.
func forwardResize(ctx context.Context, p *sdk.Process, fd int) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				if w, h, err := term.GetSize(fd); err == nil {
					_ = p.Resize(ctx, sdk.PTYSize{Cols: uint16(w), Rows: uint16(h)}) // the next change tries again
				}
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		cancel()
		<-done
	}
}

var processTable = table[*datav1.ProcessInfo]{
	header: []string{"PID", "TAG", "USER", "PTY", "AGE", "EXIT", "COMMAND"},
	row: func(p *datav1.ProcessInfo) []string {
		return []string{
			strconv.Itoa(int(p.GetPid())),
			orDash(p.GetTag()),
			orDash(p.GetUser()),
			boolean(p.GetPty()),
			age(p.GetStartedAt()),
			exitCell(p.GetExited()),
			strings.Join(p.GetArgs(), " "),
		}
	},
}

// exitCell is "-" while the process runs, else its exit code or signal.
func exitCell(e *datav1.ProcessEvent_Exited) string {
	switch {
	case e == nil:
		return "-"
	case e.GetSignal() != "":
		return e.GetSignal()
	default:
		return strconv.Itoa(int(e.GetExitCode()))
	}
}

func wsPsCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "ps ID",
		Short: "List the processes started in a Workspace that run, and those that ended recently",
		Long: "List the processes started in a Workspace (by exec or the SDK) that run, and those that\n" +
			"ended recently. EXIT is - while a process runs, else its exit code or the signal that\n" +
			"ended it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, closeIdle, err := openWorkspace(cmd, c, args[0])
			if err != nil {
				return err
			}
			defer closeIdle()
			procs, err := ws.Processes(cmd.Context())
			if err != nil {
				return err
			}
			return show(cmd, c, &datav1.ListProcessesResponse{Processes: procs}, processTable, procs...)
		},
	}
}

// logsQuiet is how long `ws logs` without -f waits for more output of a
// running process before it stops; logsFirst is the wait for the first.
const (
	logsQuiet = 250 * time.Millisecond
	logsFirst = time.Second
)

func wsLogsCommand(c *conn) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs ID (PID|TAG) [-f]",
		Short: "Print the output of a process of a Workspace; with -f follow it until it exits",
		Long: "Print the output the guest buffered for a process (its most recent output), named by pid\n" +
			"or by the tag it was started with. -f then follows the new output until the process exits\n" +
			"(and exits with its exit code, as ws exec does) or Ctrl-C.",
		Args: cobra.ExactArgs(2),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the process exits")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ref := sdk.Tag(args[1])
		if pid, err := strconv.Atoi(args[1]); err == nil && pid > 0 {
			ref = sdk.PID(pid)
		}
		ws, closeIdle, err := openWorkspace(cmd, c, args[0])
		if err != nil {
			return err
		}
		defer closeIdle()
		ctx := cmd.Context()
		ended := follow
		if !follow {
			// The buffered output of a process that ended is followed by its
			// exit; that of a running one only by silence.
			procs, err := ws.Processes(ctx)
			if err != nil {
				return err
			}
			for _, p := range procs {
				if refers(ref, p) && p.GetExited() != nil {
					ended = true
				}
			}
		}
		activity := make(chan struct{}, 1)
		stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
		if !ended {
			stdout, stderr = notify(stdout, activity), notify(stderr, activity)
		}
		p, err := ws.Connect(ctx, ref, stdout, stderr)
		if err != nil {
			return err
		}
		defer p.Close()
		if !ended {
			waitQuiet(p, activity)
		}
		status, err := p.Wait()
		if errors.Is(err, sdk.ErrDetached) {
			return nil
		}
		if follow && ctx.Err() != nil {
			return ctx.Err() // interrupted: Main says so, and exits 128 plus the signal
		}
		if code := exitCode(status); err == nil && follow && code != 0 {
			return &ExitError{Code: code} // as ws exec of it would have
		}
		return err
	}
	return cmd
}

func refers(ref sdk.ProcessRef, p *datav1.ProcessInfo) bool {
	return ref == sdk.PID(int(p.GetPid())) || (p.GetTag() != "" && ref == sdk.Tag(p.GetTag()))
}

// waitQuiet detaches from p once no output came for logsQuiet (logsFirst
// before the first), unless p exits first.
func waitQuiet(p *sdk.Process, activity <-chan struct{}) {
	ended := make(chan struct{})
	go func() {
		p.Wait()
		close(ended)
	}()
	t := time.NewTimer(logsFirst)
	defer t.Stop()
	for {
		select {
		case <-ended:
			return
		case <-activity:
			t.Reset(logsQuiet)
		case <-t.C:
			p.Close()
			return
		}
	}
}

// notify returns w that also signals activity on every write.
func notify(w io.Writer, activity chan<- struct{}) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		n, err := w.Write(b)
		select {
		case activity <- struct{}{}:
		default:
		}
		return n, err
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
