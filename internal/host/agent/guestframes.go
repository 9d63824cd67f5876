package agent

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// The budget of the frames a guest's HTTP/2 connection may send that
// carry no call's data and that the host must act on: SETTINGS, PING,
// RST_STREAM, PRIORITY, and empty DATA frames that end nothing (not
// WINDOW_UPDATE, which a guest sends as it reads what the host sends, a
// few per read: an upload's). Each costs the host work (a PING or
// SETTINGS an answer) outside any workspace's CPU quota,
// and a guest sending PINGs without end kept most of a host core busy. A
// connection may send controlFrameBurst of them at once and
// controlFramesPerSecond on average; past that the host closes it, and the
// calls on it fail as the guest's.
const (
	controlFrameBurst      = 10_000
	controlFramesPerSecond = 1_000
)

// errControlFrames is why the host closed a guest's connection.
var errControlFrames = errors.New("the guest agent sent more control frames than the host answers: connection closed")

// maxGuestConnections bounds the HTTP/2 connections the host holds to one
// guest agent. One carries all of a workspace's calls (its agent allows
// 1,024 streams); a guest that allows fewer made the host open a
// connection per call, each buffering up to a connection's window (16 MiB)
// of answers its caller had not read: about 10 MiB of the host's memory
// per call, without bound. Past the bound a call fails, unavailable.
const maxGuestConnections = 4

// errGuestConnections is why a call to a guest that holds
// maxGuestConnections failed.
var errGuestConnections = errors.New("the guest agent allows too few streams: the host holds as many connections to it as it may")

// dialGuestH2 dials an execution's data socket for HTTP/2: at most
// maxGuestConnections at once, each with its control frames counted
// against the budget.
func (a *Agent) dialGuestH2(ctx context.Context, network, addr string) (net.Conn, error) {
	id, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	a.guestConns.mu.Lock()
	if a.guestConns.open == nil {
		a.guestConns.open = map[string]int{}
	}
	if a.guestConns.open[id] >= maxGuestConnections {
		a.guestConns.mu.Unlock()
		return nil, errGuestConnections
	}
	a.guestConns.open[id]++
	a.guestConns.mu.Unlock()
	release := sync.OnceFunc(func() {
		a.guestConns.mu.Lock()
		defer a.guestConns.mu.Unlock()
		if a.guestConns.open[id]--; a.guestConns.open[id] == 0 {
			delete(a.guestConns.open, id)
		}
	})
	c, err := a.dialGuestData(ctx, network, addr)
	if err != nil {
		release()
		return nil, err
	}
	return newFrameBudgetConn(c, release, controlFrameBurst, time.Now()), nil
}

// guestConnections counts the HTTP/2 connections the host holds to each
// execution's guest agent.
type guestConnections struct {
	mu   sync.Mutex
	open map[string]int // by execution ID
}

// frameBudgetConn is a guest's HTTP/2 connection whose reads are followed
// frame by frame to count its control frames.
type frameBudgetConn struct {
	net.Conn
	release  func() // of its place among the guest's connections
	frames   recordFollower
	tokens   float64
	refilled time.Time
}

// newFrameBudgetConn returns c with tokens of the budget, last refilled
// at refilled.
func newFrameBudgetConn(c net.Conn, release func(), tokens float64, refilled time.Time) *frameBudgetConn {
	return &frameBudgetConn{Conn: c, release: release, frames: recordFollower{format: http2Frames}, tokens: tokens, refilled: refilled}
}

func (c *frameBudgetConn) Close() error {
	c.release()
	return c.Conn.Close()
}

func (c *frameBudgetConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if ferr := c.frames.follow(p[:n], c.spend); ferr != nil {
		c.Conn.Close()
		return 0, ferr
	}
	return n, err
}

// spend takes a token for a frame that carries no call's data, refilling
// the budget at its rate when it ran out.
func (c *frameBudgetConn) spend(header []byte) error {
	if carriesData(header[3], header[4], http2Frames.length(header)) {
		return nil
	}
	if c.tokens < 1 {
		now := time.Now()
		c.tokens = min(controlFrameBurst, c.tokens+now.Sub(c.refilled).Seconds()*controlFramesPerSecond)
		c.refilled = now
		if c.tokens < 1 {
			return errControlFrames
		}
	}
	c.tokens--
	return nil
}

// carriesData reports whether a frame of typ, flags and length carries a
// call's data: HEADERS and CONTINUATION, DATA that holds bytes or ends its
// stream, and WINDOW_UPDATE, which the reading of data makes.
func carriesData(typ, flags byte, length uint32) bool {
	const (
		frameData, frameHeaders, frameWindowUpdate, frameContinuation = 0x0, 0x1, 0x8, 0x9
		flagEndStream                                                 = 0x1
	)
	switch typ {
	case frameHeaders, frameContinuation, frameWindowUpdate:
		return true
	case frameData:
		return length > 0 || flags&flagEndStream != 0
	}
	return false
}
