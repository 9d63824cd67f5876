package daemon

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/fdlimit"
)

// connectionShare is the share of the process's file descriptors (the
// soft RLIMIT_NOFILE) that one listener's connections may hold at once:
// clients that open connections and keep them, idle or trickling, wait
// for a free one instead of taking the descriptors that the host agent in
// the same process needs for its workspaces, the store and the guests.
const connectionShare = 4

// minConnections is the fewest connections a listener holds whatever the
// descriptor limit.
const minConnections = 64

// callerShare is the share of a listener's connections that the calls in
// flight of one project, or one host token, may hold: on the API
// (server.Config's CallsPerCaller) and on the data plane
// (agent.Config's CallsPerProject) each. A caller that opens streams, or
// sends requests a byte at a time, until it has every connection, would
// shut the others out.
const callerShare = 4

// connectionLimit is how many connections one listener holds at once.
func connectionLimit() int {
	return fdlimit.Share(connectionShare, minConnections)
}

// limitWarnEvery spaces the warnings that a listener is at its limit.
const limitWarnEvery = time.Minute

// limitedListener holds at most cap(open) connections at once: a client
// that comes at the limit waits until one closes, or has been idle
// (between HTTP requests, as ConnState tells) for shedAfter, and then
// takes its place, closing it; the clients after it wait in the kernel's
// backlog meanwhile. Without the second, anyone who reaches the listener
// could hold every connection with a request each and an idle
// keep-alive, for the server's idle timeout (2 minutes) at a time; with
// it, an idle connection holds its place at the limit no longer than a
// silent new one does (the server's header timeout), and one idle for
// less, such as a caller's between two calls, keeps it.
type limitedListener struct {
	net.Listener
	open     chan struct{} // a token per open connection
	closed   chan struct{} // closed by Close: a waiting Accept returns
	close    sync.Once
	lastWarn time.Time // of the Accept goroutine only

	mu       sync.Mutex
	idle     map[*limitedConn]time.Time // since when each idle connection is
	wentIdle chan struct{}              // a connection went idle
	// shedAfter is how long a connection must have been idle for a new
	// client to take its place: shedIdleAfter.
	shedAfter time.Duration
}

// shedIdleAfter is how long a connection is idle before a client at the
// limit takes its place: the server's ReadHeaderTimeout, which bounds how
// long a new connection that sends nothing holds one.
const shedIdleAfter = 10 * time.Second

func limitConnections(ln net.Listener, n int) *limitedListener {
	return &limitedListener{Listener: ln, open: make(chan struct{}, n), closed: make(chan struct{}),
		idle: map[*limitedConn]time.Time{}, wentIdle: make(chan struct{}, 1), shedAfter: shedIdleAfter}
}

// ConnState is the http.Server hook that tells l which of its connections
// are idle (c may wrap one, as a *tls.Conn does).
func (l *limitedListener) ConnState(c net.Conn, state http.ConnState) {
	for {
		if lc, ok := c.(*limitedConn); ok {
			l.mu.Lock()
			if state == http.StateIdle {
				l.idle[lc] = time.Now()
				select {
				case l.wentIdle <- struct{}{}:
				default:
				}
			} else {
				delete(l.idle, lc)
			}
			l.mu.Unlock()
			return
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		c = w.NetConn()
	}
}

// shedIdle closes the connection idle longest when it has been idle for
// shedAfter and returns 0; otherwise it returns how long until it will
// have been, or -1 when no connection is idle.
func (l *limitedListener) shedIdle() time.Duration {
	l.mu.Lock()
	var oldest *limitedConn
	for c, since := range l.idle {
		if oldest == nil || since.Before(l.idle[oldest]) {
			oldest = c
		}
	}
	if oldest == nil {
		l.mu.Unlock()
		return -1
	}
	if wait := l.shedAfter - time.Since(l.idle[oldest]); wait > 0 {
		l.mu.Unlock()
		return wait
	}
	delete(l.idle, oldest)
	l.mu.Unlock()
	oldest.Close()
	return 0
}

// Accept implements net.Listener.
func (l *limitedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// A client is here: at the limit, it takes the place of the next
	// connection to close, or of one idle for shedAfter.
	for {
		select {
		case l.open <- struct{}{}:
			return l.holding(c), nil
		default:
		}
		wait := l.shedIdle()
		if wait == 0 {
			continue
		}
		if now := time.Now(); now.Sub(l.lastWarn) >= limitWarnEvery {
			l.lastWarn = now
			slog.Warn("the listener holds as many connections as it may; new clients wait until one closes, or has been idle for a while",
				"addr", l.Addr().String(), "connections", cap(l.open), "idle", l.shedAfter)
		}
		var shed <-chan time.Time
		if wait > 0 {
			shed = time.After(wait)
		}
		select {
		case l.open <- struct{}{}:
			return l.holding(c), nil
		case <-l.wentIdle:
		case <-shed:
		case <-l.closed:
			c.Close()
			return nil, net.ErrClosed
		}
	}
}

// holding is c, accepted with a token of l's, which it gives back when it
// closes.
func (l *limitedListener) holding(c net.Conn) *limitedConn {
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() { <-l.open }), forget: l.forget}
}

// forget drops c from the idle connections.
func (l *limitedListener) forget(c *limitedConn) {
	l.mu.Lock()
	delete(l.idle, c)
	l.mu.Unlock()
}

// Close implements net.Listener.
func (l *limitedListener) Close() error {
	l.close.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitedConn gives its token back when it closes. It keeps the two
// methods of *net.TCPConn that net/http looks for (which is why this is
// not x/net's netutil.LimitListener, whose conns hide them): ReadFrom,
// through which a response copied from a socket (the file bytes path's
// download) moves with splice(2), and CloseWrite, which ends a refused
// request's connection with a FIN first.
type limitedConn struct {
	net.Conn
	release func()
	forget  func(*limitedConn) // drops it from its listener's idle ones
}

// Close implements net.Conn.
func (c *limitedConn) Close() error {
	if c.forget != nil {
		c.forget(c)
	}
	err := c.Conn.Close()
	c.release()
	return err
}

// ReadFrom implements io.ReaderFrom.
func (c *limitedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// CloseWrite shuts down the sending side, where the connection has one.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
