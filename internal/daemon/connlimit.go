package daemon

import (
	"io"
	"log/slog"
	"net"
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

// limitedListener holds at most cap(open) connections at once: at the
// limit, Accept waits until one of them closes, and new clients wait in
// the kernel's backlog meanwhile.
type limitedListener struct {
	net.Listener
	open     chan struct{} // a token per open connection
	closed   chan struct{} // closed by Close: a waiting Accept returns
	close    sync.Once
	lastWarn time.Time // of the Accept goroutine only
}

func limitConnections(ln net.Listener, n int) *limitedListener {
	return &limitedListener{Listener: ln, open: make(chan struct{}, n), closed: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *limitedListener) Accept() (net.Conn, error) {
	select {
	case l.open <- struct{}{}:
	default:
		if now := time.Now(); now.Sub(l.lastWarn) >= limitWarnEvery {
			l.lastWarn = now
			slog.Warn("the listener holds as many connections as it may; new clients wait until one closes",
				"addr", l.Addr().String(), "connections", cap(l.open))
		}
		select {
		case l.open <- struct{}{}:
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.open
		return nil, err
	}
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() { <-l.open })}, nil
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
}

// Close implements net.Conn.
func (c *limitedConn) Close() error {
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
