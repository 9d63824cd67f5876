// Command kibotos-guest is the guest agent: PID 1 of every execution. It
// reaps orphans, answers the host's probes on /run/kibotos/agent.sock and
// ends the guest cleanly on STOP or SIGTERM. It is static and imports only
// the standard library and golang.org/x/sys (imports_test.go keeps it so).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guestagent"
)

// sigtermGrace is the grace of a stop requested by SIGTERM.
const sigtermGrace = 5 * time.Second

func main() {
	os.Exit(run())
}

func run() int {
	socket := flag.String("socket", guestagent.SocketPath, "unix socket to serve the probe protocol on")
	flag.Parse()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "kibotos-guest: "+format+"\n", args...)
	}
	pid1 := os.Getpid() == 1

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Register SIGTERM before anything else: as PID 1 an unhandled SIGTERM
	// is ignored, and we want it to mean "stop".
	term := make(chan os.Signal, 1)
	signal.Notify(term, unix.SIGTERM, unix.SIGINT)
	if pid1 {
		go guestagent.Reap(ctx)
	}

	if err := os.MkdirAll(filepath.Dir(*socket), 0o755); err != nil {
		logf("%v", err)
		return 1
	}
	os.Remove(*socket)
	ln, err := net.Listen("unix", *socket)
	if err != nil {
		logf("%v", err)
		return 1
	}
	srv := &guestagent.Server{
		BootID: guestagent.NewBootID(),
		Logf:   logf,
		Stop: func(grace time.Duration) error {
			if pid1 {
				return guestagent.TerminateAll(grace)
			}
			unix.Sync()
			return nil
		},
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ctx, ln) }()

	select {
	case <-srv.Done():
	case <-term:
		if err := srv.StopNow(sigtermGrace); err != nil {
			logf("stop: %v", err)
		}
	case err := <-serveErr:
		logf("serve: %v", err)
		return 1
	}
	cancel()
	return 0
}
