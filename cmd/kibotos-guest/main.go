// Command kibotos-guest is the guest agent: PID 1 of every execution. It
// reaps orphans, answers the host's probes on /run/kibotos/agent.sock,
// serves the data plane (kibotos.data.v1 processes, files, TCP services,
// screen and input, Connect over h2c) on /run/kibotos/data.sock, runs the
// X display of a template that carries one (--display, before it answers
// probes), and ends the guest cleanly on the host's STOP, or as the guest
// asks its init (SIGTERM, SIGINT: a reset; SIGUSR1, SIGUSR2: a shutdown;
// see guestabi's EndFile). It is not dumpable, out of the reach of ptrace; started as
// kibotos-exec it is the exec shim of the data plane (package
// internal/guest/execshim). It is static; imports_test.go fences what it
// may link.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/guest/dataplane"
	"github.com/kibotos/kibotos/internal/guest/pid1"
	"github.com/kibotos/kibotos/internal/guest/x11"
	"github.com/kibotos/kibotos/internal/guestabi"
)

const (
	// endGrace is the grace of a reset or shutdown the guest asks for.
	endGrace = 5 * time.Second
	// flushTimeout bounds how long a stop waits, once the processes are
	// gone, for the data plane to report their exits to its streams.
	flushTimeout = 3 * time.Second
)

func main() {
	// Out of ptrace's reach, /proc/1/mem's and /proc/1/environ's: a guest
	// process, even root without CAP_SYS_PTRACE, must not stop or read
	// the agent. exec makes the processes it starts dumpable again.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "kibotos-guest: not dumpable: %v\n", err)
		os.Exit(1)
	}
	os.Exit(run())
}

func run() int {
	socket := flag.String("socket", pid1.SocketPath, "unix socket to serve the probe protocol on")
	dataSocket := flag.String("data-socket", pid1.DataSocketPath, "unix socket to serve the data plane on")
	displaySize := flag.String(guestabi.DisplayFlag, "", "run the X display "+guestabi.DisplayName+" of this size (WIDTHxHEIGHT) before answering probes")
	flag.Parse()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "kibotos-guest: "+format+"\n", args...)
	}
	isPID1 := os.Getpid() == 1

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Register init's signals before anything else: as PID 1 a signal
	// without a handler never arrives.
	reset := make(chan os.Signal, 1)
	signal.Notify(reset, unix.SIGTERM, unix.SIGINT)
	shutdown := make(chan os.Signal, 1)
	signal.Notify(shutdown, unix.SIGUSR1, unix.SIGUSR2)
	if isPID1 {
		// The signals that mean nothing to init are caught and dropped:
		// a guest's `kill -HUP 1` (init's "reload") was the Go runtime's
		// exit, which ended every process of the workspace at once. A
		// handler rather than SIG_IGN, which the processes the agent
		// starts would inherit.
		meaningless := make(chan os.Signal, 8)
		signal.Notify(meaningless, unix.SIGHUP, unix.SIGQUIT, unix.SIGILL, unix.SIGTRAP, unix.SIGABRT,
			unix.SIGBUS, unix.SIGFPE, unix.SIGSEGV, unix.SIGSTKFLT, unix.SIGSYS)
		go func() {
			for range meaningless {
			}
		}()
	}

	// One owner of waiting for children: as PID 1 the Reaper (which also
	// reaps orphans), else a wait per child.
	reaper := pid1.NewReaper()
	var waiter dataplane.Waiter = dataplane.ChildWaiter{}
	if isPID1 {
		go reaper.Run(ctx)
		waiter = reaper
	}
	env := os.Environ()
	if *displaySize != "" {
		env = append(env, "DISPLAY="+guestabi.DisplayName)
	}
	procs := dataplane.NewProcessService(dataplane.ProcessConfig{Waiter: waiter, Env: env, Logf: logf})
	files := dataplane.NewFileService(dataplane.FileConfig{Logf: logf})
	// The display is up before the probe socket exists: the host's
	// readiness probe waits for it.
	display := startDisplay(ctx, *displaySize, procs, logf)
	dataSrv := dataplane.NewServer(dataplane.NewHandler(procs, files, dataplane.NewServiceService(), display))

	ln, err := listen(*socket)
	if err != nil {
		logf("%v", err)
		return 1
	}
	dataLn, err := listen(*dataSocket)
	if err != nil {
		ln.Close()
		logf("%v", err)
		return 1
	}
	srv := &pid1.Server{
		BootID: pid1.NewBootID(),
		Logf:   logf,
		Stop: func(grace time.Duration) error {
			var err error
			if isPID1 {
				// The Reaper hands the exits of the data plane's processes
				// to it while it waits for everything to end.
				err = reaper.TerminateAll(grace)
			} else {
				err = procs.Terminate(grace)
				unix.Sync()
			}
			flushDataPlane(procs, files, dataSrv, logf)
			return err
		},
	}
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(ctx, ln) }()
	go func() {
		if err := dataSrv.Serve(dataLn); !errors.Is(err, http.ErrServerClosed) {
			serveErr <- fmt.Errorf("data plane: %w", err)
		}
	}()

	// end ends the guest as it asked and records how, for the host.
	end := func(how string) {
		if err := srv.StopNow(endGrace); err != nil {
			logf("%s: %v", how, err)
		}
		if err := pid1.RecordEnd(filepath.Dir(*socket), how); err != nil {
			logf("%s: recording it: %v", how, err)
		}
	}
	select {
	case <-srv.Done():
	case <-reset:
		end(guestabi.EndReset)
	case <-shutdown:
		end(guestabi.EndShutdown)
	case err := <-serveErr:
		logf("serve: %v", err)
		return 1
	}
	cancel()
	dataSrv.Close()
	return 0
}

// startDisplay runs the X display of size (none when empty) and returns
// the services of its screen and input. A display that fails to start is
// logged, and its services say why.
func startDisplay(ctx context.Context, size string, procs *dataplane.ProcessService, logf func(string, ...any)) *dataplane.DisplayService {
	if size == "" {
		return dataplane.NewDisplayService(nil, dataplane.NoDisplay)
	}
	d, err := guestabi.ParseDisplaySize(size)
	if err == nil {
		var display *x11.Display
		display, err = x11.Start(ctx, x11.Config{Width: int(d.Width), Height: int(d.Height), Logf: logf,
			Launch: func(args []string, tag string) (<-chan struct{}, error) {
				return procs.Launch(&datav1.StartProcessRequest{Args: args, Tag: tag})
			}})
		if err == nil {
			return dataplane.NewDisplayService(display, "")
		}
	}
	logf("display: %v", err)
	return dataplane.NewDisplayService(nil, fmt.Sprintf("the display did not start: %v", err))
}

// listen listens on a fresh unix socket at path that only root may use:
// the data plane runs anything as anyone, so the guest's other users must
// not reach it.
func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// flushDataPlane lets the data plane's streams report the exits of the
// processes that a stop ended, then closes it: every process's exit
// recorded, watches ended, calls in flight finished.
func flushDataPlane(procs *dataplane.ProcessService, files *dataplane.FileService, srv *http.Server, logf func(string, ...any)) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	if err := procs.Wait(ctx); err != nil {
		logf("stop: processes still running: %v", err)
	}
	files.Close()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
}
