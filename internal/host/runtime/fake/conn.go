package fake

import (
	"net"
	"net/http"
	"sync"
)

// serveConn returns the client end of an in-memory connection whose other
// end h serves over HTTP/1.1 and cleartext HTTP/2, as a guest's data socket is served,
// allowing streams HTTP/2 streams at once (0: Go's default).
// The server ends with the connection, which closes once ended is closed,
// as a guest's connections close when it ends.
func serveConn(h http.Handler, streams int, ended <-chan struct{}) net.Conn {
	client, server := net.Pipe()
	l := &oneConnListener{conn: &closeNotifyConn{Conn: server, closed: make(chan struct{})}}
	go func() {
		select {
		case <-ended:
			l.conn.Close()
		case <-l.conn.closed:
		}
	}()
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxConcurrentStreams: streams}}
	srv.Protocols.SetHTTP1(true) // as the guest agent's, for the file bytes path
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	return client
}

// oneConnListener accepts its one connection, then blocks until that
// connection is closed and ends, so that Serve returns with it.
type oneConnListener struct {
	conn     *closeNotifyConn
	accepted bool
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.accepted {
		l.accepted = true
		return l.conn, nil
	}
	<-l.conn.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// closeNotifyConn closes closed when it is closed.
type closeNotifyConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeNotifyConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
