package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// serverCommand is the first argument that makes this program one of the
// test host's servers.
const serverCommand = "server"

// The kinds of server besides the workloads' own (a workload's mode).
const (
	kindSOCKS5 = "socks5"
	kindDNS    = "dns"
)

// startServer starts a server of kind (a workload's mode, kindSOCKS5 or
// kindDNS) on the test host: this program again, in a process of its own
// in the test host's namespace, as a destination is a process apart from
// the network that carries the guest's traffic to it. In this process it
// would share the Go runtime's processors with the slot, and the slot's
// figures would carry the server's scheduling, where pasta and
// slirp4netns run apart. It returns the address the server listens on;
// stop closes the server's standard input, upon which it stops listening,
// and waits for it to exit once its connections have ended.
func (b *bench) startServer(ctx context.Context, kind string) (netip.AddrPort, func() error, error) {
	cmd, err := self(ctx, serverCommand, "-kind", kind, "-d", b.d.String(), "-cc", b.cc)
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	if err := startIn(b.inet.Path, cmd); err != nil {
		return netip.AddrPort{}, nil, fmt.Errorf("test host %s server: %w", kind, err)
	}
	stop := func() error {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("test host %s server: %v: %s", kind, err, bytes.TrimSpace(stderr.Bytes()))
		}
		return nil
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, perr := netip.ParseAddrPort(strings.TrimSpace(line))
	if err != nil || perr != nil {
		stop()
		return netip.AddrPort{}, nil, fmt.Errorf("test host %s server did not say where it listens: %q: %s", kind, line, bytes.TrimSpace(stderr.Bytes()))
	}
	return addr, stop, nil
}

// runServer is a test host server's main: it listens on the test host's
// address, prints the address, and serves its kind until its standard
// input ends; it returns once its connections have ended.
func runServer(args []string) error {
	fs := flag.NewFlagSet(serverCommand, flag.ContinueOnError)
	kind := fs.String("kind", "", "what to serve: a workload's mode, socks5 or dns")
	d := fs.Duration("d", 5*time.Second, "duration of a measurement")
	cc := fs.String("cc", "", "TCP congestion control")
	if err := fs.Parse(args); err != nil {
		return err
	}
	at := net.JoinHostPort(nettest.HostIPv4.String(), "0")
	var closer io.Closer
	var serveAll func()
	var addr net.Addr
	switch *kind {
	case kindDNS:
		pc, err := net.ListenPacket("udp4", at)
		if err != nil {
			return err
		}
		closer, addr, serveAll = pc, pc.LocalAddr(), func() { serveDNS(pc) }
	case kindSOCKS5:
		l, err := net.Listen("tcp4", at)
		if err != nil {
			return err
		}
		closer, addr, serveAll = l, l.Addr(), func() { serveSOCKS5(l) }
	default:
		lc := net.ListenConfig{Control: congestionControl(*cc)}
		l, err := lc.Listen(context.Background(), "tcp4", at)
		if err != nil {
			return err
		}
		closer, addr, serveAll = l, l.Addr(), func() { serve(l, *kind, *d) }
	}
	var wg sync.WaitGroup
	wg.Go(serveAll)
	fmt.Println(addr)
	io.Copy(io.Discard, os.Stdin)
	closer.Close()
	wg.Wait()
	return nil
}

// startProxy starts a SOCKS5 server on the test host and points sb at it;
// stop ends it once its connections have ended.
func (b *bench) startProxy(ctx context.Context, sb *sandbox) (stop func() error, err error) {
	addr, stop, err := b.startServer(ctx, kindSOCKS5)
	if err != nil {
		return nil, err
	}
	if err := sb.viaProxy(addr); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// serveSOCKS5 is a SOCKS5 server (RFC 1928: no authentication, CONNECT to
// an IP address) for the Egress row: it serves l until l closes and
// returns once its connections have ended.
func serveSOCKS5(l net.Listener) {
	serveEach(l, func(c net.Conn) {
		out, err := socks5Connect(c)
		if err != nil {
			return
		}
		defer out.Close()
		var pipes sync.WaitGroup
		pipes.Go(func() { pipe(c.(*net.TCPConn), out) })
		pipe(out, c.(*net.TCPConn))
		pipes.Wait()
	})
}

// serveEach runs handle on each connection l accepts, in its own goroutine,
// and closes the connection after it; it returns once l closed and every
// handle ended.
func serveEach(l net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer c.Close()
			handle(c)
		})
	}
}

// socks5Connect reads the client's greeting and CONNECT request, dials its
// destination and answers.
func socks5Connect(c net.Conn) (*net.TCPConn, error) {
	var head [2]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return nil, err
	}
	methods := make([]byte, head[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{5, 0}); err != nil {
		return nil, err
	}
	var req [4]byte
	if _, err := io.ReadFull(c, req[:]); err != nil {
		return nil, err
	}
	var ip []byte
	switch req[3] {
	case 1:
		ip = make([]byte, 4)
	case 4:
		ip = make([]byte, 16)
	default:
		c.Write([]byte{5, 8, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, errors.New("address type not supported")
	}
	var port [2]byte
	if _, err := io.ReadFull(c, ip); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(c, port[:]); err != nil {
		return nil, err
	}
	a, _ := netip.AddrFromSlice(ip)
	out, err := net.Dial("tcp", netip.AddrPortFrom(a, binary.BigEndian.Uint16(port[:])).String())
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, err
	}
	bound := out.LocalAddr().(*net.TCPAddr)
	reply := append([]byte{5, 0, 0, 1}, bound.IP.To4()...)
	reply = binary.BigEndian.AppendUint16(reply, uint16(bound.Port))
	if _, err := c.Write(reply); err != nil {
		out.Close()
		return nil, err
	}
	return out.(*net.TCPConn), nil
}

// pipe copies src to dst, then half-closes dst.
func pipe(dst, src *net.TCPConn) {
	io.Copy(dst, src)
	dst.CloseWrite()
}

// serveDNS answers every A query on pc with one address from memory, as a
// resolver answers from its cache, until pc closes.
func serveDNS(pc net.PacketConn) {
	buf := make([]byte, dns.MaxMsgSize)
	rr := &dns.A{Hdr: dns.RR_Header{Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IPv4(192, 0, 2, 1)}
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:n]) != nil || len(q.Question) != 1 {
			continue
		}
		m := new(dns.Msg).SetReply(q)
		a := *rr
		a.Hdr.Name = q.Question[0].Name
		m.Answer = []dns.RR{&a}
		if out, err := m.Pack(); err == nil {
			pc.WriteTo(out, from)
		}
	}
}
