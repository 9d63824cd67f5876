package dataplane

import (
	"errors"
	"io"
	mathrand "math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// listenLoopback listens on a free port of the IPv4 loopback and returns
// it with its port.
func listenLoopback(t *testing.T) (*net.TCPListener, uint32) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, uint32(ln.Addr().(*net.TCPAddr).Port)
}

// acceptOne serves the next connection of ln with serve, in the
// background; the channel is closed once serve returned.
func acceptOne(t *testing.T, ln *net.TCPListener, serve func(*net.TCPConn)) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.AcceptTCP()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		serve(c)
	}()
	return done
}

type serviceStream = connect.BidiStreamForClient[datav1.ConnectServiceRequest, datav1.ConnectServiceResponse]

// receiveAll receives until the stream ends and returns the data, whether
// an eof message came, and the stream's error.
func receiveAll(s *serviceStream) ([]byte, bool, error) {
	var data []byte
	eof := false
	for {
		msg, err := s.Receive()
		if errors.Is(err, io.EOF) {
			return data, eof, nil
		}
		if err != nil {
			return data, eof, err
		}
		if eof && len(msg.GetData()) > 0 {
			return data, eof, errors.New("data after eof")
		}
		data = append(data, msg.GetData()...)
		eof = eof || msg.GetEof()
	}
}

// connected opens a stream to port and receives the connected message.
func (e *testEnv) connected(t *testing.T, port uint32, data []byte) *serviceStream {
	t.Helper()
	s := e.sc.ConnectService(testCtx(t, 30*time.Second))
	t.Cleanup(func() { s.CloseResponse() })
	if err := s.Send(&datav1.ConnectServiceRequest{Port: port, Data: data}); err != nil {
		t.Fatal(err)
	}
	msg, err := s.Receive()
	if err != nil || !msg.GetConnected() || len(msg.GetData()) > 0 {
		t.Fatalf("first message %v, %v; want connected", msg, err)
	}
	return s
}

// TestServiceHalfCloseFromCaller: the caller's end of requests is the
// service's EOF, and its answer still comes back.
func TestServiceHalfCloseFromCaller(t *testing.T) {
	e := newTestEnv(t)
	ln, port := listenLoopback(t)
	served := acceptOne(t, ln, func(c *net.TCPConn) {
		in, err := io.ReadAll(c) // until the caller's half-close
		if err != nil {
			t.Error(err)
		}
		c.Write([]byte("got " + string(in)))
	})
	s := e.connected(t, port, []byte("first "))
	if err := s.Send(&datav1.ConnectServiceRequest{Data: []byte("second")}); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	data, eof, err := receiveAll(s)
	if err != nil || !eof || string(data) != "got first second" {
		t.Errorf("answer %q, eof %v, %v; want %q and eof", data, eof, err, "got first second")
	}
	<-served
}

// TestServiceHalfCloseFromService: after the service shut its side down
// the caller gets eof and may still send; the stream ends once it ends
// its requests.
func TestServiceHalfCloseFromService(t *testing.T) {
	e := newTestEnv(t)
	ln, port := listenLoopback(t)
	var got atomic.Value
	served := acceptOne(t, ln, func(c *net.TCPConn) {
		c.Write([]byte("hello"))
		c.CloseWrite()
		in, _ := io.ReadAll(c)
		got.Store(string(in))
	})
	s := e.connected(t, port, nil)
	var data []byte
	for {
		msg, err := s.Receive()
		if err != nil {
			t.Fatalf("before eof: %v", err)
		}
		data = append(data, msg.GetData()...)
		if msg.GetEof() {
			break
		}
	}
	if string(data) != "hello" {
		t.Errorf("data before eof %q", data)
	}
	if err := s.Send(&datav1.ConnectServiceRequest{Data: []byte("after eof")}); err != nil {
		t.Fatalf("send after the service's eof: %v", err)
	}
	s.CloseRequest()
	if rest, _, err := receiveAll(s); err != nil || len(rest) > 0 {
		t.Errorf("after eof: %q, %v; want a clean end", rest, err)
	}
	<-served
	if got.Load() != "after eof" {
		t.Errorf("the service read %q", got.Load())
	}
}

// TestServiceRefusals: bad ports, a missing first message, a closed port,
// a port named twice, and a connection the service resets.
func TestServiceRefusals(t *testing.T) {
	e := newTestEnv(t)
	for _, port := range []uint32{0, 70000} {
		s := e.sc.ConnectService(testCtx(t, 10*time.Second))
		s.Send(&datav1.ConnectServiceRequest{Port: port})
		_, _, err := receiveAll(s)
		wantCode(t, err, connect.CodeInvalidArgument, stageConnectingService)
	}
	s := e.sc.ConnectService(testCtx(t, 10*time.Second))
	s.CloseRequest()
	_, _, err := receiveAll(s)
	wantCode(t, err, connect.CodeInvalidArgument, stageConnectingService)

	ln, port := listenLoopback(t)
	ln.Close()
	s = e.sc.ConnectService(testCtx(t, 10*time.Second))
	s.Send(&datav1.ConnectServiceRequest{Port: port})
	_, _, err = receiveAll(s)
	wantCode(t, err, connect.CodeUnavailable, stageConnectingService)

	ln, port = listenLoopback(t)
	acceptOne(t, ln, func(c *net.TCPConn) { io.Copy(io.Discard, c) })
	s = e.connected(t, port, nil)
	s.Send(&datav1.ConnectServiceRequest{Port: port})
	_, _, err = receiveAll(s)
	wantCode(t, err, connect.CodeInvalidArgument, stageUsingService)

	ln, port = listenLoopback(t)
	acceptOne(t, ln, func(c *net.TCPConn) {
		// The caller's first byte comes once its dial has returned: a
		// reset before that would fail the dial instead of the stream.
		io.ReadFull(c, make([]byte, 1))
		c.Write([]byte("partial"))
		c.SetLinger(0) // close with a reset
	})
	s = e.connected(t, port, []byte("x"))
	data, eof, err := receiveAll(s)
	if eof {
		t.Errorf("a reset connection gave eof (data %q)", data)
	}
	wantCode(t, err, connect.CodeUnavailable, stageUsingService)
}

// TestServiceBackPressure: a caller that reads nothing stops a service
// that writes without end, and a service that reads nothing stops the
// caller, each after a bounded number of bytes; then everything arrives.
func TestServiceBackPressure(t *testing.T) {
	e := newTestEnv(t)
	const bound = 64 << 20 // socket buffers, HTTP/2 windows, a few messages
	// Random bytes: nothing may compress them away.
	block := make([]byte, 64<<10)
	mathrand.NewChaCha8([32]byte{1}).Read(block)

	// The service writes; the caller does not read.
	ln, port := listenLoopback(t)
	var wrote atomic.Int64
	served := acceptOne(t, ln, func(c *net.TCPConn) {
		for wrote.Load() < bound+16<<20 {
			n, err := c.Write(block)
			wrote.Add(int64(n))
			if err != nil {
				return
			}
		}
		c.CloseWrite()
	})
	s := e.connected(t, port, nil)
	stalled := awaitStall(&wrote)
	if stalled >= bound {
		t.Errorf("the service wrote %d bytes to a caller that reads nothing", stalled)
	}
	s.CloseRequest()
	data, eof, err := receiveAll(s)
	if err != nil || !eof || int64(len(data)) != wrote.Load() {
		t.Errorf("received %d bytes (eof %v, %v) of %d written", len(data), eof, err, wrote.Load())
	}
	<-served

	// The caller writes; the service does not read until told.
	ln, port = listenLoopback(t)
	release := make(chan struct{})
	var read atomic.Int64
	served = acceptOne(t, ln, func(c *net.TCPConn) {
		<-release
		n, _ := io.Copy(io.Discard, c)
		read.Store(n)
	})
	s = e.connected(t, port, nil)
	var sent atomic.Int64
	sending := make(chan error, 1)
	go func() {
		for sent.Load() < bound+16<<20 {
			if err := s.Send(&datav1.ConnectServiceRequest{Data: block}); err != nil {
				sending <- err
				return
			}
			sent.Add(int64(len(block)))
		}
		sending <- s.CloseRequest()
	}()
	stalled = awaitStall(&sent)
	if stalled >= bound {
		t.Errorf("the caller sent %d bytes to a service that reads nothing", stalled)
	}
	close(release)
	if err := <-sending; err != nil {
		t.Fatal(err)
	}
	if _, _, err := receiveAll(s); err != nil {
		t.Fatal(err)
	}
	<-served
	if read.Load() != sent.Load() {
		t.Errorf("the service read %d bytes of %d sent", read.Load(), sent.Load())
	}
}

// awaitStall waits until n has not grown for a second and returns it.
func awaitStall(n *atomic.Int64) int64 {
	last := n.Load()
	for {
		time.Sleep(time.Second)
		now := n.Load()
		if now == last {
			return now
		}
		last = now
	}
}

// TestServiceGuestAddresses: a service bound to IPv6 loopback only is
// reached too.
func TestServiceGuestAddresses(t *testing.T) {
	e := newTestEnv(t)
	ln, err := net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer ln.Close()
	acceptOne(t, ln, func(c *net.TCPConn) { c.Write([]byte("v6")) })
	s := e.connected(t, uint32(ln.Addr().(*net.TCPAddr).Port), nil)
	s.CloseRequest()
	if data, _, err := receiveAll(s); err != nil || !strings.HasPrefix(string(data), "v6") {
		t.Errorf("got %q, %v", data, err)
	}
}
