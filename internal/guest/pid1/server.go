// Package pid1 is the inside of an execution: the probe protocol the
// host speaks over the agent's unix socket (server.go) and the duties of the
// guest's PID 1 (pid1_linux.go): the Reaper, which owns all waiting for
// children, and TerminateAll. It imports only the standard library and
// golang.org/x/sys, because it is linked into the static kibotos-guest.
// The data plane (processes, files) is package internal/guest.
//
// The protocol is line based. The client sends one command per line and
// reads one answer line:
//
//	PING            -> READY <boot-id>
//	STOP <grace-ms> -> STOPPED   (processes ended and synced; the agent exits)
//	anything else   -> ERR <reason>
package pid1

import (
	"github.com/kibotos/kibotos/internal/guestabi"

	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SocketPath is the agent's probe socket and DataSocketPath the socket
// serving kibotos.data.v1 (Connect over h2c).
const (
	SocketPath     = guestabi.SocketDir + "/" + guestabi.ProbeSocket
	DataSocketPath = guestabi.SocketDir + "/" + guestabi.DataSocket
)

// maxLine bounds one command line.
const maxLine = 4096

// NewBootID returns a random identifier for one run of the agent.
func NewBootID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// Server answers the probe protocol.
type Server struct {
	// BootID identifies this run of the agent in READY answers.
	BootID string
	// Stop ends every other process of the guest within grace and syncs
	// the filesystems. It runs once, however many STOPs arrive.
	Stop func(grace time.Duration) error
	// Logf, if set, receives diagnostic messages.
	Logf func(format string, args ...any)

	once    sync.Once
	stopErr error
	stopped chan struct{} // closed when Stop has returned
	done    chan struct{} // closed when a STOPPED answer was written
	initMu  sync.Mutex
	doneMu  sync.Once
}

func (s *Server) init() {
	s.initMu.Lock()
	defer s.initMu.Unlock()
	if s.stopped == nil {
		s.stopped = make(chan struct{})
		s.done = make(chan struct{})
	}
}

// Done is closed once a STOP completed and its answer was sent (or
// StopNow returned): the agent's process should then exit.
func (s *Server) Done() <-chan struct{} {
	s.init()
	return s.done
}

// StopNow runs the stop procedure as a STOP command would, for a signal.
func (s *Server) StopNow(grace time.Duration) error {
	err := s.stop(grace)
	s.doneMu.Do(func() { close(s.done) })
	return err
}

func (s *Server) stop(grace time.Duration) error {
	s.init()
	s.once.Do(func() {
		if s.Stop != nil {
			s.stopErr = s.Stop(grace)
		}
		close(s.stopped)
	})
	<-s.stopped
	return s.stopErr
}

// Serve accepts connections on ln until ctx ends or ln fails, and closes
// ln and every open connection when it returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.init()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	stopListener := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopListener()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			stopConn := context.AfterFunc(ctx, func() { c.Close() })
			defer stopConn()
			defer c.Close()
			s.serveConn(c)
		}()
	}
}

func (s *Server) serveConn(c net.Conn) {
	r := bufio.NewReaderSize(c, maxLine)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				fmt.Fprintf(c, "ERR line too long\n")
			}
			return
		}
		cmd, arg, _ := strings.Cut(strings.TrimRight(string(line), "\r\n"), " ")
		switch cmd {
		case "PING":
			if _, err := fmt.Fprintf(c, "READY %s\n", s.BootID); err != nil {
				return
			}
		case "STOP":
			ms, err := strconv.ParseUint(arg, 10, 32)
			if err != nil {
				fmt.Fprintf(c, "ERR bad grace %q\n", arg)
				continue
			}
			if err := s.stop(time.Duration(ms) * time.Millisecond); err != nil {
				s.logf("stop: %v", err)
			}
			// STOPPED means the processes are gone and the guest synced;
			// a stop error above is logged, the host then unmounts anyway.
			fmt.Fprintf(c, "STOPPED\n")
			s.doneMu.Do(func() { close(s.done) })
			return
		default:
			fmt.Fprintf(c, "ERR unknown command %q\n", cmd)
		}
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}
