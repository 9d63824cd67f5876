// Package serviceconn turns a kibotos.data.v1 ConnectService stream into a
// net.Conn: the one adapter the SDK's DialPort (and so the CLI's
// port-forward) and the host agent's DialGuestPort share.
package serviceconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
)

const (
	// chunk bounds the data of one request message.
	chunk = 64 << 10
	// linger bounds how long a closed Conn waits for the guest to finish
	// its side before the stream is canceled.
	linger = 5 * time.Second
)

// Addr is the address of a guest port: Network "kibotos", String
// "<workspace>:<port>".
type Addr struct {
	Workspace string
	Port      uint32
}

// Network returns "kibotos".
func (Addr) Network() string { return "kibotos" }

func (a Addr) String() string { return fmt.Sprintf("%s:%d", a.Workspace, a.Port) }

// Conn is a connection to a guest port over a ConnectService stream. It
// is a net.Conn with deadlines, and has CloseWrite, which ends the
// request stream: the guest service reads EOF while the Conn still reads.
// Read returns io.EOF once the service shut its side down; errors of the
// stream are the *connect.Error the data plane returned.
type Conn struct {
	stream *connect.BidiStreamForClient[datav1.ConnectServiceRequest, datav1.ConnectServiceResponse]
	cancel context.CancelFunc
	remote Addr

	closed    chan struct{} // closed by Close
	closeOnce sync.Once

	// The read half: receive runs Receive and hands each message over.
	messages     chan *datav1.ConnectServiceResponse
	receiveDone  chan struct{} // closed once the response stream ended
	receiveErr   error         // why it ended; nil at its clean end
	readMu       sync.Mutex
	pending      []byte
	eof          bool
	readDeadline deadline

	// The write half: send runs Send and CloseRequest, one at a time.
	writes        chan []byte // nil asks for CloseRequest
	written       chan error
	writeMu       sync.Mutex
	inFlight      bool // a write whose result Write has not taken
	writeClosed   bool
	writeDeadline deadline
}

// Dial opens a ConnectService stream to port through client and returns
// it as a Conn once the guest has connected. ctx bounds only the
// connecting, as net.Dialer's does. A port nothing listens on is the
// guest's unavailable error with stage CONNECTING_SERVICE; a port of 0 or
// above 65535 is invalid_argument.
func Dial(ctx context.Context, client datav1connect.ServiceServiceClient, remote Addr) (*Conn, error) {
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	stream := client.ConnectService(streamCtx)
	fail := func(err error) (*Conn, error) {
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if err := stream.Send(&datav1.ConnectServiceRequest{Port: remote.Port}); err != nil && !errors.Is(err, io.EOF) {
		return fail(err)
	}
	// A refused Send wraps io.EOF; Receive has the server's error.
	first, err := stream.Receive()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = connect.NewError(connect.CodeInternal, errors.New("ConnectService: the stream ended before the guest connected"))
		}
		return fail(err)
	}
	if !first.GetConnected() {
		return fail(connect.NewError(connect.CodeInternal, errors.New("ConnectService: the first message is not the connected one")))
	}
	if !stop() {
		return fail(ctx.Err())
	}
	c := &Conn{stream: stream, cancel: cancel, remote: remote, closed: make(chan struct{}),
		messages: make(chan *datav1.ConnectServiceResponse), receiveDone: make(chan struct{}),
		writes: make(chan []byte), written: make(chan error, 1),
		readDeadline: newDeadline(), writeDeadline: newDeadline()}
	go c.receive()
	go c.send()
	return c, nil
}

// receive hands each response to Read, or drops it once the Conn is
// closed, until the response stream ends; then the stream is done with.
func (c *Conn) receive() {
	defer c.cancel()
	defer close(c.receiveDone)
	for {
		msg, err := c.stream.Receive()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.receiveErr = err
			}
			return
		}
		select {
		case c.messages <- msg:
		case <-c.closed:
		}
	}
}

// send runs the Sends Write asks for and the CloseRequest of CloseWrite or
// Close.
func (c *Conn) send() {
	for {
		select {
		case data := <-c.writes:
			if data == nil {
				c.written <- c.stream.CloseRequest()
				return
			}
			c.written <- c.stream.Send(&datav1.ConnectServiceRequest{Data: data})
		case <-c.closed:
			c.stream.CloseRequest()
			return
		}
	}
}

// Read reads what the guest service sent; io.EOF once it shut its side
// down.
func (c *Conn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if isDone(c.closed) {
		return 0, net.ErrClosed
	}
	for len(c.pending) == 0 {
		switch {
		case isDone(c.closed):
			return 0, net.ErrClosed
		case c.eof:
			return 0, io.EOF
		case c.readDeadline.expired():
			return 0, os.ErrDeadlineExceeded
		}
		select {
		case msg := <-c.messages:
			c.pending, c.eof = msg.GetData(), msg.GetEof()
		case <-c.receiveDone:
			if c.receiveErr != nil {
				return 0, c.receiveErr
			}
			c.eof = true
		case <-c.closed:
		case <-c.readDeadline.wait():
		}
	}
	n := copy(b, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// Write sends b to the guest service in messages of up to 64 KiB. It
// returns once they are handed to the stream; when the write deadline
// passes first, the bytes counted in n are sent still, the rest not.
func (c *Conn) Write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	n := 0
	for n < len(b) {
		part := b[n:min(len(b), n+chunk)]
		if err := c.request(append([]byte(nil), part...)); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && c.inFlight {
				n += len(part)
			}
			return n, err
		}
		n += len(part)
	}
	return n, nil
}

// CloseWrite ends the request stream once what Write handed over is
// sent: the guest service reads EOF. Reading goes on.
func (c *Conn) CloseWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	return c.request(nil)
}

// request hands data (nil: the end of the request stream) to send and
// waits for its result, after the result of an earlier one that a
// deadline left behind. It holds writeMu.
func (c *Conn) request(data []byte) error {
	if c.inFlight {
		if err := c.result(); err != nil {
			return err
		}
	}
	if c.writeClosed {
		return fmt.Errorf("write to %s after CloseWrite: %w", c.remote, net.ErrClosed)
	}
	if c.writeDeadline.expired() {
		return os.ErrDeadlineExceeded
	}
	select {
	case c.writes <- data:
	case <-c.closed:
		return net.ErrClosed
	case <-c.writeDeadline.wait():
		return os.ErrDeadlineExceeded
	}
	c.inFlight = true
	c.writeClosed = data == nil
	return c.result()
}

// result waits for the result of the write in flight.
func (c *Conn) result() error {
	select {
	case err := <-c.written:
		c.inFlight = false
		if errors.Is(err, io.EOF) {
			// The call ended; its error, if the response stream has it
			// already, says why.
			select {
			case <-c.receiveDone:
				if c.receiveErr != nil {
					return c.receiveErr
				}
			default:
			}
			return fmt.Errorf("write to %s: the guest ended the connection: %w", c.remote, net.ErrClosed)
		}
		return err
	case <-c.closed:
		return net.ErrClosed
	case <-c.writeDeadline.wait():
		return os.ErrDeadlineExceeded
	}
}

// Close closes the connection: Read and Write return net.ErrClosed. What
// Write handed over is still sent, then the request stream ends; the
// stream is canceled once the guest has ended its side too, or after 5
// seconds, whatever the service does meanwhile.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		t := time.AfterFunc(linger, c.cancel)
		go func() {
			<-c.receiveDone
			t.Stop()
		}()
	})
	return nil
}

// LocalAddr returns an Addr with no workspace and port 0: the caller's
// end has none.
func (c *Conn) LocalAddr() net.Addr { return Addr{} }

// RemoteAddr returns the guest port's Addr.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.readDeadline.set(t)
	c.writeDeadline.set(t)
	return nil
}

// SetReadDeadline sets the time after which a Read returns
// os.ErrDeadlineExceeded; zero means none.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.readDeadline.set(t)
	return nil
}

// SetWriteDeadline sets the time after which a Write returns
// os.ErrDeadlineExceeded; zero means none.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.writeDeadline.set(t)
	return nil
}
