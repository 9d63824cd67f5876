package sdktest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/guest/dataplane"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk/serviceconn"
)

// dialEcho serves the guest agent's ServiceService in-process and returns
// a Conn to a loopback server that echoes until the caller's half-close,
// then half-closes too.
func dialEcho(t *testing.T) *serviceconn.Conn {
	t.Helper()
	echo := testutil.ServeOnce(t, func(c net.Conn) {
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
	})
	mux := http.NewServeMux()
	mux.Handle(datav1connect.NewServiceServiceHandler(dataplane.NewServiceService()))
	srv := testutil.H2CServer(t, mux)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	client := datav1connect.NewServiceServiceClient(&http.Client{Transport: tr}, srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port := uint32(echo.Port)
	c, err := serviceconn.Dial(ctx, client, serviceconn.Addr{Workspace: "ws_a", Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if got := c.RemoteAddr().String(); got != "ws_a:"+itoa(port) {
		t.Errorf("RemoteAddr %q", got)
	}
	return c
}

func itoa(n uint32) string { return (&net.TCPAddr{Port: int(n)}).String()[1:] }

func TestReadDeadline(t *testing.T) {
	c := dialEcho(t)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var ne net.Error
	if _, err := c.Read(make([]byte, 10)); !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing to read: %v, want a timeout", err)
	}
	// A deadline in the past fails at once; clearing it makes Read wait
	// for data again.
	c.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := c.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q, %v", buf, err)
	}
}

func TestWriteDeadline(t *testing.T) {
	c := dialEcho(t)
	c.SetWriteDeadline(time.Now().Add(-time.Second))
	if n, err := c.Write([]byte("x")); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past the deadline: %d, %v", n, err)
	}
	// Nobody reads the echo: the writes back up until the deadline.
	c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
	block := make([]byte, 1<<20)
	total := 0
	for {
		n, err := c.Write(block)
		total += n
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("write: %v", err)
			}
			break
		}
		if total > 1<<30 {
			t.Fatal("1 GiB written to a peer that reads nothing")
		}
	}
	// What Write counted arrives, in full, once the reader reads.
	type result struct {
		n   int64
		err error
	}
	echoed := make(chan result, 1)
	go func() {
		n, err := io.Copy(io.Discard, c)
		echoed <- result{n, err}
	}()
	c.SetWriteDeadline(time.Time{})
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	r := <-echoed
	if n, err := r.n, r.err; err != nil || n != int64(total) {
		t.Errorf("echoed %d bytes, %v; Write counted %d", n, err, total)
	}
}

func TestCloseWriteAndClose(t *testing.T) {
	c := dialEcho(t)
	if _, err := c.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("more")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after CloseWrite: %v", err)
	}
	if got, err := io.ReadAll(c); err != nil || string(got) != "last words" {
		t.Errorf("read after CloseWrite: %q, %v", got, err)
	}
	c.Close()
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after Close: %v", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after Close: %v", err)
	}
}
