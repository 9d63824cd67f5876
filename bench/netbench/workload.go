package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/host/socks5"
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
	// modeDNS: the guest sends UDP queries, dnsWorkers at a time, each
	// worker waiting for its answer before the next query.
	modeDNS = "dns"
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
	// dnsWorkers is the number of queries in flight in modeDNS.
	dnsWorkers = 4
	// dnsTimeout is how long a DNS worker waits for an answer before it
	// counts the query lost and sends the next.
	dnsTimeout = time.Second
)

// result is what the client measured.
type result struct {
	Bytes   int64   `json:"bytes"`
	Conns   int     `json:"conns"` // connections, or answered queries
	Lost    int     `json:"lost"`  // queries left unanswered
	Seconds float64 `json:"seconds"`
	// Connecting and Exchanging are the connections' time, in all, from
	// the dial to the connection established, and from there to the whole
	// response read: where a network's connection takes its time.
	Connecting time.Duration `json:"connecting,omitempty"`
	Exchanging time.Duration `json:"exchanging,omitempty"`
}

func (r result) gbits() float64 { return float64(r.Bytes) * 8 / r.Seconds / 1e9 }
func (r result) rate() float64  { return float64(r.Conns) / r.Seconds }

// workload is one measurement's kind.
type workload struct {
	mode    string
	streams int // parallel connections of modeUp and modeDown
}

func (w workload) String() string {
	if w.streams > 1 {
		return fmt.Sprintf("%s%d", w.mode, w.streams)
	}
	return w.mode
}

// bench is what the measurements share.
type bench struct {
	inet *nettest.Internet
	// dns is the test host's DNS server.
	dns netip.AddrPort
	d   time.Duration
	// cc is the TCP congestion control of the client's and the server's
	// sockets; empty, the kernel's default.
	cc string
}

// measure serves one workload on the test host and runs the client inside
// the sandbox's namespace. Each measurement has its own listening port, so
// no connection meets a TIME_WAIT left by an earlier one (the side that
// closes first holds each connection's 4-tuple for a minute, and a run
// would otherwise exhaust the ephemeral ports toward one address). DNS queries go to
// the sandbox's resolver (sb.dns), else to the test host's DNS server.
func (b *bench) measure(ctx context.Context, sb *sandbox, w workload) (r result, err error) {
	if w.mode == modeDNS {
		target := b.dns
		if sb.dns.IsValid() {
			target = sb.dns
		}
		return b.runClient(ctx, sb, w, target.String())
	}
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
	addr, stopServer, err := b.startServer(ctx, w.mode)
	if err != nil {
		return result{}, err
	}
	defer func() {
		if serr := stopServer(); err == nil {
			err = serr
		}
	}()
	if sb.viaProxy != nil {
		// A SOCKS5 server of its own, for the same reason as the port.
		stopProxy, perr := b.startProxy(ctx, sb)
		if perr != nil {
			return result{}, perr
		}
		defer func() {
			if serr := stopProxy(); err == nil {
				err = serr
			}
		}()
	}
	return b.runClient(ctx, sb, w, addr.String())
}

// self is a command that runs this program again with args, killed when
// this process dies or ctx ends.
func self(ctx context.Context, args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	return cmd, nil
}

// startIn starts cmd in the network namespace bound at path, or in this
// process's own when path is empty: a process starts in the namespace of
// the thread that forks it.
func startIn(path string, cmd *exec.Cmd) error {
	if path == "" {
		return cmd.Start()
	}
	return netnsfile.Do(path, cmd.Start)
}

// runClient runs the client of w against addr inside the sandbox's
// namespace and returns what it measured.
func (b *bench) runClient(ctx context.Context, sb *sandbox, w workload, addr string) (r result, err error) {
	var stdout, stderr bytes.Buffer
	args := []string{clientCommand, "-mode", w.mode, "-streams", fmt.Sprint(max(w.streams, 1)),
		"-addr", addr, "-d", b.d.String(), "-cc", b.cc}
	if sb.proxy.IsValid() {
		args = append(args, "-socks5", sb.proxy.String())
	}
	cmd, err := self(ctx, args...)
	if err != nil {
		return result{}, err
	}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := startIn(sb.path, cmd); err != nil {
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
	serveEach(l, func(c net.Conn) {
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

// runClient is the client's main: it runs one workload against the server
// and prints its result as JSON.
func runClient(args []string) error {
	fs := flag.NewFlagSet(clientCommand, flag.ContinueOnError)
	mode := fs.String("mode", "", "the workload")
	addr := fs.String("addr", "", "the server's address")
	d := fs.Duration("d", 5*time.Second, "duration")
	cc := fs.String("cc", "", "TCP congestion control")
	streams := fs.Int("streams", 1, "parallel connections of up and down")
	proxy := fs.String("socks5", "", "a SOCKS5 server to connect through (empty: connect directly)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dialer := newDialer(*cc, *proxy)
	var r result
	var err error
	switch *mode {
	case modeUp:
		r, err = parallel(*streams, func() (result, error) { return send(dialer, *addr, *d) })
	case modeDown:
		r, err = parallel(*streams, func() (result, error) { return receive(dialer, *addr, *d) })
	case modeConn, modeConnServerCloses:
		r, err = connect(dialer, *addr, *d, *mode == modeConnServerCloses)
	case modeDNS:
		r, err = query(*addr, *d)
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

// dialFunc connects to the server at addr.
type dialFunc func(addr string) (*net.TCPConn, error)

// newDialer dials with the congestion control cc, directly or, with proxy
// set, through that SOCKS5 server with the slot's own client (the proxy
// hop without a sandbox in front of it).
func newDialer(cc, proxy string) dialFunc {
	direct := &net.Dialer{Timeout: 5 * time.Second, Control: congestionControl(cc)}
	if proxy == "" {
		return func(addr string) (*net.TCPConn, error) {
			c, err := direct.Dial("tcp4", addr)
			if err != nil {
				return nil, err
			}
			return c.(*net.TCPConn), nil
		}
	}
	via := &socks5.Dialer{Endpoint: socks5.Endpoint{Address: proxy}}
	return func(addr string) (*net.TCPConn, error) {
		c, err := via.DialContext(context.Background(), "tcp", addr)
		if err != nil {
			return nil, err
		}
		return c.(*net.TCPConn), nil
	}
}

// send writes for d, then waits for the server's close, which comes once
// everything written has arrived.
func send(dial dialFunc, addr string, d time.Duration) (result, error) {
	return timed(dial, addr, d, func(c *net.TCPConn, start time.Time) (int64, error) {
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
func receive(dial dialFunc, addr string, d time.Duration) (result, error) {
	return timed(dial, addr, d, func(c *net.TCPConn, _ time.Time) (int64, error) {
		n, err := drain(c)
		if err == nil && n == 0 {
			err = errors.New("received nothing")
		}
		return n, err
	})
}

// parallel runs n transfers at once and adds up what they moved over the
// longest one's time.
func parallel(n int, transfer func() (result, error)) (result, error) {
	results := make([]result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i], errs[i] = transfer() })
	}
	wg.Wait()
	var sum result
	for i, r := range results {
		if errs[i] != nil {
			return result{}, fmt.Errorf("stream %d: %w", i+1, errs[i])
		}
		sum.Bytes += r.Bytes
		sum.Seconds = max(sum.Seconds, r.Seconds)
	}
	return sum, nil
}

// query sends DNS queries for an A record to the resolver at addr for d,
// dnsWorkers at a time, each worker on its own UDP socket waiting for the
// answer to its query before it sends the next.
func query(addr string, d time.Duration) (result, error) {
	var answered, lost atomic.Int64
	start := time.Now()
	end := start.Add(d)
	errs := make(chan error, dnsWorkers)
	for w := range dnsWorkers {
		go func() {
			errs <- func() error {
				c, err := net.Dial("udp", addr)
				if err != nil {
					return err
				}
				defer c.Close()
				m := new(dns.Msg).SetQuestion("bench.example.", dns.TypeA)
				q, err := m.Pack()
				if err != nil {
					return err
				}
				buf := make([]byte, dns.MaxMsgSize)
				for id := uint16(w) << 12; time.Now().Before(end); id++ {
					binary.BigEndian.PutUint16(q, id)
					if _, err := c.Write(q); err != nil {
						return err
					}
					c.SetReadDeadline(time.Now().Add(dnsTimeout))
					for {
						n, err := c.Read(buf)
						if errors.Is(err, os.ErrDeadlineExceeded) {
							lost.Add(1)
							break
						}
						if err != nil {
							return err
						}
						var a dns.Msg
						if n >= 2 && binary.BigEndian.Uint16(buf) == id {
							if err := a.Unpack(buf[:n]); err != nil || a.Rcode != dns.RcodeSuccess || len(a.Answer) != 1 {
								return fmt.Errorf("answer %v: %v", a.Answer, err)
							}
							answered.Add(1)
							break
						}
					}
				}
				return nil
			}()
		}()
	}
	var err error
	for range dnsWorkers {
		err = errors.Join(err, <-errs)
	}
	if err == nil && answered.Load() == 0 {
		err = errors.New("no query answered")
	}
	return result{Conns: int(answered.Load()), Lost: int(lost.Load()), Seconds: time.Since(start).Seconds()}, err
}

// timed runs a transfer of d on one connection to addr, bounded by d and
// some slack, and returns the bytes it moved and how long it took.
func timed(dial dialFunc, addr string, d time.Duration, transfer func(c *net.TCPConn, start time.Time) (int64, error)) (result, error) {
	c, err := dial(addr)
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
func connect(dial dialFunc, addr string, d time.Duration, serverCloses bool) (result, error) {
	req := bytes.Repeat([]byte{'x'}, message)
	resp := make([]byte, message)
	start := time.Now()
	var r result
	for end := start.Add(d); r.Conns < maxConns && time.Now().Before(end); r.Conns++ {
		if err := exchange(dial, addr, req, resp, serverCloses, &r); err != nil {
			return result{}, fmt.Errorf("connection %d, %.1fs in: %w", r.Conns+1, time.Since(start).Seconds(), err)
		}
	}
	r.Seconds = time.Since(start).Seconds()
	return r, nil
}

// exchange makes one connection of the connection rate, adding its times
// to r's.
func exchange(dial dialFunc, addr string, req, resp []byte, serverCloses bool, r *result) error {
	begun := time.Now()
	c, err := dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	connected := time.Now()
	r.Connecting += connected.Sub(begun)
	c.SetDeadline(connected.Add(5 * time.Second))
	if _, err := c.Write(req); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, resp); err != nil {
		return err
	}
	r.Exchanging += time.Since(connected)
	if serverCloses {
		if n, err := drain(c); err != nil || n > 0 {
			return fmt.Errorf("after the response: %d more bytes, %v", n, err)
		}
	}
	return nil
}

// drainBuffers are drain's buffers: a chunk allocated per connection would
// have the server collect garbage at the connection rate, on the two CPUs
// the network under test uses too.
var drainBuffers = sync.Pool{New: func() any { b := make([]byte, chunk); return &b }}

// drain reads c until EOF.
func drain(c net.Conn) (int64, error) {
	bufp := drainBuffers.Get().(*[]byte)
	defer drainBuffers.Put(bufp)
	buf := *bufp
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
