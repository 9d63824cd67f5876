// Package pid1 is the inside of an execution: the server of the probe
// protocol that guestabi defines, which the host speaks over the agent's
// unix socket (server.go), and the duties of the guest's PID 1
// (pid1_linux.go): the Reaper, which owns all waiting for children, and
// TerminateAll. It imports only the standard library, golang.org/x/sys
// and guestabi, because it is linked into the static kibotos-guest. The
// data plane (processes, files) is package internal/guest/dataplane.
package pid1

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// SocketPath is the agent's probe socket and DataSocketPath the socket
// serving kibotos.data.v1 (Connect over h2c).
const (
	SocketPath     = guestabi.SocketDir + "/" + guestabi.ProbeSocket
	DataSocketPath = guestabi.SocketDir + "/" + guestabi.DataSocket
)

// NewBootID returns a random identifier for one run of the agent.
func NewBootID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// Server answers the probe protocol (see guestabi).
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
	r := guestabi.NewProbeReader(c)
	for {
		line, err := r.ReadLine()
		if err != nil {
			if errors.Is(err, guestabi.ErrProbeLineTooLong) {
				guestabi.WriteProbeLine(c, guestabi.AnswerError+" "+err.Error())
			}
			return
		}
		cmd, err := guestabi.ParseProbeCommand(line)
		if err != nil {
			guestabi.WriteProbeLine(c, guestabi.AnswerError+" "+err.Error())
			continue
		}
		switch cmd.Verb {
		case guestabi.CommandPing:
			if err := guestabi.WriteProbeLine(c, guestabi.AnswerReady+" "+s.BootID); err != nil {
				return
			}
		case guestabi.CommandStop:
			if err := s.stop(cmd.Grace); err != nil {
				s.logf("stop: %v", err)
			}
			// STOPPED means the processes are gone and the guest synced;
			// a stop error above is logged, the host then unmounts anyway.
			guestabi.WriteProbeLine(c, guestabi.AnswerStopped)
			s.doneMu.Do(func() { close(s.done) })
			return
		}
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}
