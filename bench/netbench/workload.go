package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// clientCommand is the first argument that makes this program the client.
const clientCommand = "client"

// The workloads, named from the guest's side.
const (
	modeUp   = "up"   // the guest sends to the server for the duration
	modeDown = "down" // the server sends to the guest for the duration
	// modeConn: the guest opens connections one after another, each with
	// a request and its response, and closes each first.
	modeConn = "conn"
	// modeConnServerCloses is modeConn with the server closing each
	// connection first, as an HTTP/1.0 server does.
	modeConnServerCloses = "conn-server-closes"
)

const (
	// chunk is one read or write of the throughput workloads.
	chunk = 128 << 10
	// message is the size of a connection's request and of its response.
	message = 64
	// maxConns bounds one connection measurement: the side that closes
	// first keeps each connection's ephemeral port in TIME_WAIT for a
	// minute, and a namespace has some 28,000 of them.
	maxConns = 20000
	// slack bounds how long a measurement may overrun its duration.
	slack = 30 * time.Second
)

// result is what the client measured.
type result struct {
	Bytes   int64   `json:"bytes"`
	Conns   int     `json:"conns"`
	Seconds float64 `json:"seconds"`
}

func (r result) gbits() float64 { return float64(r.Bytes) * 8 / r.Seconds / 1e9 }
func (r result) rate() float64  { return float64(r.Conns) / r.Seconds }

// bench is what the measurements share.
type bench struct {
	inet *nettest.Internet
	d    time.Duration
	// cc is the TCP congestion control of the client's and the server's
	// sockets; empty, the kernel's default.
	cc string
}

// measure serves one workload on the test host and runs the client inside
// the sandbox's namespace. Each measurement has its own listening port, so
// no connection meets a TIME_WAIT left by an earlier one.
func (b *bench) measure(ctx context.Context, sb *sandbox, mode string) (r result, err error) {
	link, err := uplink()
	if err != nil {
		return result{}, err
	}
	defer func() {
		now, check := uplink()
		if err == nil && check == nil && now != link {
			check = fmt.Errorf("its link %s became %s", link, now)
		}
		if err == nil && check != nil {
			err = fmt.Errorf("the test host changed during the measurement: %w", check)
		}
	}()
	var l net.Listener
	err = netnsfile.Do(b.inet.Path, func() (err error) {
		lc := net.ListenConfig{Control: congestionControl(b.cc)}
		l, err = lc.Listen(ctx, "tcp4", net.JoinHostPort(nettest.HostIPv4.String(), "0"))
		return err
	})
	if err != nil {
		return result{}, err
	}
	var wg sync.WaitGroup
	wg.Go(func() { serve(l, mode, b.d) })
	defer func() {
		l.Close()
		wg.Wait()
	}()

	exe, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, exe, clientCommand, "-mode", mode, "-addr", l.Addr().String(), "-d", b.d.String(), "-cc", b.cc)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	start := cmd.Start
	if sb.path != "" {
		// A process starts in the network namespace of the thread that
		// forks it.
		start = func() error { return netnsfile.Do(sb.path, cmd.Start) }
	}
	if err := start(); err != nil {
		return result{}, err
	}
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return result{}, ctx.Err()
		}
		if msg := bytes.TrimSpace(stderr.Bytes()); len(msg) > 0 {
			return result{}, fmt.Errorf("client: %v: %s", err, msg)
		}
		return result{}, fmt.Errorf("client: %v", err)
	}
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return result{}, fmt.Errorf("client output %q: %w", stdout.Bytes(), err)
	}
	return r, nil
}

// serve answers the connections of one workload until l closes; it
// returns once they have all ended.
func serve(l net.Listener, mode string, d time.Duration) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(d + slack))
			switch mode {
			case modeUp:
				// Closing at EOF tells the client that all it sent arrived.
				drain(c)
			case modeDown:
				buf := make([]byte, chunk)
				for end := time.Now().Add(d); time.Now().Before(end); {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			case modeConn, modeConnServerCloses:
				buf := make([]byte, message)
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil || mode == modeConnServerCloses {
					return
				}
				drain(c)
			}
		})
	}
}

// runClient is the client's main: it runs one workload against the server
// and prints its result as JSON.
func runClient(args []string) error {
	fs := flag.NewFlagSet(clientCommand, flag.ContinueOnError)
	mode := fs.String("mode", "", "the workload")
	addr := fs.String("addr", "", "the server's address")
	d := fs.Duration("d", 5*time.Second, "duration")
	cc := fs.String("cc", "", "TCP congestion control")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, Control: congestionControl(*cc)}
	var r result
	var err error
	switch *mode {
	case modeUp:
		r, err = send(dialer, *addr, *d)
	case modeDown:
		r, err = receive(dialer, *addr, *d)
	case modeConn, modeConnServerCloses:
		r, err = connect(dialer, *addr, *d, *mode == modeConnServerCloses)
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// congestionControl sets a socket's TCP congestion control to cc; with cc
// empty it does nothing.
func congestionControl(cc string) func(network, address string, c syscall.RawConn) error {
	if cc == "" {
		return nil
	}
	return func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) {
			err = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc)
		}); cerr != nil {
			return cerr
		}
		if err != nil {
			return fmt.Errorf("congestion control %s: %w", cc, err)
		}
		return nil
	}
}

func dial(dialer *net.Dialer, addr string) (*net.TCPConn, error) {
	c, err := dialer.Dial("tcp4", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// send writes for d, then waits for the server's close, which comes once
// everything written has arrived.
func send(dialer *net.Dialer, addr string, d time.Duration) (result, error) {
	return timed(dialer, addr, d, func(c *net.TCPConn, start time.Time) (int64, error) {
		buf := make([]byte, chunk)
		var n int64
		for end := start.Add(d); time.Now().Before(end); {
			w, err := c.Write(buf)
			n += int64(w)
			if err != nil {
				return n, err
			}
		}
		if err := c.CloseWrite(); err != nil {
			return n, err
		}
		_, err := drain(c)
		return n, err
	})
}

// receive reads until the server, sending for d, closes.
func receive(dialer *net.Dialer, addr string, d time.Duration) (result, error) {
	return timed(dialer, addr, d, func(c *net.TCPConn, _ time.Time) (int64, error) {
		n, err := drain(c)
		if err == nil && n == 0 {
			err = errors.New("received nothing")
		}
		return n, err
	})
}

// timed runs a transfer of d on one connection to addr, bounded by d and
// some slack, and returns the bytes it moved and how long it took.
func timed(dialer *net.Dialer, addr string, d time.Duration, transfer func(c *net.TCPConn, start time.Time) (int64, error)) (result, error) {
	c, err := dial(dialer, addr)
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	start := time.Now()
	c.SetDeadline(start.Add(d + slack))
	n, err := transfer(c, start)
	if err != nil {
		return result{}, err
	}
	return result{Bytes: n, Seconds: time.Since(start).Seconds()}, nil
}

// connect opens connections one after another for d (at most maxConns),
// each with a request and its response; it closes each once the response
// is in, or once the server has closed when serverCloses.
func connect(dialer *net.Dialer, addr string, d time.Duration, serverCloses bool) (result, error) {
	req := bytes.Repeat([]byte{'x'}, message)
	resp := make([]byte, message)
	start := time.Now()
	n := 0
	for end := start.Add(d); n < maxConns && time.Now().Before(end); n++ {
		if err := exchange(dialer, addr, req, resp, serverCloses); err != nil {
			return result{}, fmt.Errorf("connection %d, %.1fs in: %w", n+1, time.Since(start).Seconds(), err)
		}
	}
	return result{Conns: n, Seconds: time.Since(start).Seconds()}, nil
}

func exchange(dialer *net.Dialer, addr string, req, resp []byte, serverCloses bool) error {
	c, err := dial(dialer, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(req); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, resp); err != nil {
		return err
	}
	if serverCloses {
		if n, err := drain(c); err != nil || n > 0 {
			return fmt.Errorf("after the response: %d more bytes, %v", n, err)
		}
	}
	return nil
}

// drain reads c until EOF.
func drain(c net.Conn) (int64, error) {
	buf := make([]byte, chunk)
	var n int64
	for {
		r, err := c.Read(buf)
		n += int64(r)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
