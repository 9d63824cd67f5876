package sdk

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
)

// endlessProcess starts a process that prints one line and never exits.
type endlessProcess struct {
	datav1connect.UnimplementedProcessServiceHandler
}

func (endlessProcess) StartProcess(ctx context.Context, _ *connect.Request[datav1.StartProcessRequest], s *connect.ServerStream[datav1.ProcessEvent]) error {
	if err := s.Send(&datav1.ProcessEvent{Event: &datav1.ProcessEvent_Started_{Started: &datav1.ProcessEvent_Started{Pid: 7}}}); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}

// cutter relays TCP connections to a server until cut closes them all, as
// the death of the server's process does.
type cutter struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutter(t *testing.T, backend string) *cutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln}
	t.Cleanup(func() { ln.Close(); c.cut(false) })
	go func() {
		for {
			front, err := ln.Accept()
			if err != nil {
				return
			}
			back, err := net.Dial("tcp", backend)
			if err != nil {
				front.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, front, back)
			c.mu.Unlock()
			go io.Copy(back, front)
			go io.Copy(front, back)
		}
	}()
	return c
}

// cut closes every relayed connection; with reset, the client's side is
// reset (RST) rather than closed in order (FIN).
func (c *cutter) cut(reset bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		if reset {
			conn.(*net.TCPConn).SetLinger(0)
		}
		conn.Close()
	}
	c.conns = nil
}

// TestCutStreamIsUnavailable cuts the connection under a running stream,
// over HTTP/2 (as the SDK speaks to http:// servers) and HTTP/1 (as the
// CLI's other calls do), closed in order and reset: the stream ends with
// CodeUnavailable, which a caller retries, never with Connect's
// invalid_argument protocol error. A caller that cancels still reads
// canceled.
func TestCutStreamIsUnavailable(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(datav1connect.NewProcessServiceHandler(endlessProcess{}))
	srv := h2cServer(t, mux)

	for _, tc := range []struct {
		name   string
		base   http.RoundTripper
		reset  bool
		cancel bool
	}{
		{name: "h2c closed", reset: false},
		{name: "h2c reset", reset: true},
		{name: "http1 closed", base: http.DefaultTransport.(*http.Transport).Clone()},
		{name: "http1 reset", base: http.DefaultTransport.(*http.Transport).Clone(), reset: true},
		{name: "h2c canceled by the caller", cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			relay := newCutter(t, srv.Listener.Addr().String())
			hc := NewHTTPClient(tc.base)
			defer hc.CloseIdleConnections()
			client := datav1connect.NewProcessServiceClient(hc, "http://"+relay.ln.Addr().String())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stream, err := client.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			if !stream.Receive() {
				t.Fatalf("no first event: %v", stream.Err())
			}
			want := connect.CodeUnavailable
			if tc.cancel {
				cancel()
				want = connect.CodeCanceled
			} else {
				relay.cut(tc.reset)
			}
			if stream.Receive() {
				t.Fatalf("a second event: %v", stream.Msg())
			}
			if got := connect.CodeOf(stream.Err()); got != want {
				t.Errorf("the stream ended with %v, want %v", stream.Err(), want)
			}
		})
	}
}

// TestTransportErrorSaysItOnce: a transfer cut by a broken connection,
// which the transport already calls unavailable, reads "unavailable" once.
func TestTransportErrorSaysItOnce(t *testing.T) {
	cut := connect.NewError(connect.CodeUnavailable, errors.New("the connection to the server broke during the call; retry"))
	err := transportError(context.Background(), cut)
	if connect.CodeOf(err) != connect.CodeUnavailable || strings.Count(err.Error(), "unavailable") != 1 {
		t.Errorf("transportError of an unavailable error: %v", err)
	}
	if err := transportError(context.Background(), io.ErrUnexpectedEOF); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("transportError of a plain error: %v", err)
	}
}
