// Package socks5test runs a SOCKS5 server (RFC 1928, RFC 1929) for tests.
// It really relays: CONNECT dials the target and UDP ASSOCIATE relays
// datagrams. It can be made to fail in one of the ways an endpoint fails,
// and records what it served.
package socks5test

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Fault is one way of being broken.
type Fault int32

const (
	// None serves correctly.
	None Fault = iota
	// RejectAuth answers RFC 1929 with status 1, even for the right
	// credentials.
	RejectAuth
	// NoAcceptableMethod answers the greeting with method 0xFF.
	NoAcceptableMethod
	// Garbage answers the greeting with bytes that are not SOCKS (an HTTP
	// error response).
	Garbage
	// Hang never answers the greeting.
	Hang
	// CloseAfterGreeting answers the greeting and then closes the
	// connection.
	CloseAfterGreeting
	// RefuseUDP answers UDP ASSOCIATE with 0x07 (command not supported).
	RefuseUDP
	// RefuseConnect answers CONNECT with 0x05 (connection refused) without
	// dialing.
	RefuseConnect
	// DeadRelay answers UDP ASSOCIATE with a loopback port nothing listens
	// on.
	DeadRelay
)

var faultNames = [...]string{"None", "RejectAuth", "NoAcceptableMethod", "Garbage", "Hang",
	"CloseAfterGreeting", "RefuseUDP", "RefuseConnect", "DeadRelay"}

func (f Fault) String() string {
	if f >= 0 && int(f) < len(faultNames) {
		return faultNames[f]
	}
	return "Fault(" + strconv.Itoa(int(f)) + ")"
}

// Options configures a Server.
type Options struct {
	// Username and Password, when Username is set, are required with
	// RFC 1929, and a client that does not offer it gets method 0xFF.
	Username, Password string
	// TLS serves over TLS when set.
	TLS *tls.Config
	// UDP supports UDP ASSOCIATE; without it the request gets 0x07.
	UDP bool
	// Fault is the fault at start; see SetFault.
	Fault Fault
	// RelayIP is the address the UDP relay listens on and answers; the
	// zero Addr selects the address the server listens on.
	RelayIP netip.Addr
	// UnspecifiedRelay answers UDP ASSOCIATE with 0.0.0.0 (or :: for an
	// IPv6 relay) and the relay's port, which means the server's own
	// address.
	UnspecifiedRelay bool
	// HoldConnect, when set, holds each CONNECT, once recorded in Connects,
	// until it is closed: a test changes something while the client dials.
	HoldConnect <-chan struct{}
}

// dialTimeout bounds the dial of a CONNECT target.
const dialTimeout = 5 * time.Second

// Server is a running SOCKS5 server. It stops, closing every connection and
// relay, when the test that started it ends.
type Server struct {
	o     Options
	ln    net.Listener
	fault atomic.Int32
	wg    sync.WaitGroup

	mu        sync.Mutex
	stopped   bool
	open      map[io.Closer]struct{}
	accepted  int
	connects  []string
	datagrams int
}

// Start listens on addr (such as "127.0.0.1:0") and serves until the test
// ends.
func Start(t testing.TB, addr string, o Options) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("socks5test: %v", err)
	}
	s := &Server{o: o, ln: ln, open: map[io.Closer]struct{}{}}
	if o.TLS != nil {
		s.ln = tls.NewListener(ln, o.TLS)
	}
	s.fault.Store(int32(o.Fault))
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(s.stop)
	return s
}

// Addr is the address the server listens on, as host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// SetFault changes the fault for the connections accepted from now on.
func (s *Server) SetFault(f Fault) { s.fault.Store(int32(f)) }

// Accepted is the number of TCP connections accepted so far.
func (s *Server) Accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

// Connects lists the target of every CONNECT request received, in order,
// as host:port: a hostname as sent, an IP address in its canonical text
// (IPv6 in brackets).
func (s *Server) Connects() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.connects...)
}

// UDPDatagrams is the number of datagrams relayed from clients to targets.
func (s *Server) UDPDatagrams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.datagrams
}

func (s *Server) stop() {
	s.mu.Lock()
	s.stopped = true
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
	s.wg.Wait()
}

// track registers c to be closed at stop. It returns false, having closed
// c, when the server has stopped already.
func (s *Server) track(c io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		c.Close()
		return false
	}
	s.open[c] = struct{}{}
	return true
}

func (s *Server) release(c io.Closer) {
	s.mu.Lock()
	delete(s.open, c)
	s.mu.Unlock()
	c.Close()
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.accepted++
		s.mu.Unlock()
		if !s.track(c) {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.release(c)
			s.handle(c, Fault(s.fault.Load()))
		}()
	}
}

// RFC 1928 and RFC 1929 constants.
const (
	version        = 0x05
	methodNone     = 0x00
	methodPassword = 0x02
	noAcceptable   = 0xff
	cmdConnect     = 0x01
	cmdUDP         = 0x03

	repSuccess         = 0x00
	repFailure         = 0x01
	repNetUnreachable  = 0x03
	repHostUnreachable = 0x04
	repRefused         = 0x05
	repNotSupported    = 0x07
)

func (s *Server) handle(c net.Conn, fault Fault) {
	if fault == Hang {
		_, _ = io.Copy(io.Discard, c)
		return
	}
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil || hdr[0] != version {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return
	}
	switch fault {
	case Garbage:
		_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		return
	case NoAcceptableMethod:
		_, _ = c.Write([]byte{version, noAcceptable})
		return
	}
	want := byte(methodNone)
	if s.o.Username != "" {
		want = methodPassword
	}
	if !containsByte(methods, want) {
		_, _ = c.Write([]byte{version, noAcceptable})
		return
	}
	if _, err := c.Write([]byte{version, want}); err != nil || fault == CloseAfterGreeting {
		return
	}
	if want == methodPassword && !s.authenticate(c, fault) {
		return
	}
	var req [3]byte // VER, CMD, RSV
	if _, err := io.ReadFull(c, req[:]); err != nil || req[0] != version {
		return
	}
	target, err := readTarget(c)
	if err != nil {
		return
	}
	switch {
	case req[1] == cmdConnect:
		s.connect(c, target, fault)
	case req[1] == cmdUDP && s.o.UDP:
		s.associate(c, fault)
	default:
		reply(c, repNotSupported, netip.AddrPort{})
	}
}

func containsByte(b []byte, x byte) bool {
	for _, y := range b {
		if y == x {
			return true
		}
	}
	return false
}

// authenticate runs RFC 1929 and reports whether the client may go on.
func (s *Server) authenticate(c net.Conn, fault Fault) bool {
	var ver [1]byte
	if _, err := io.ReadFull(c, ver[:]); err != nil || ver[0] != 0x01 {
		return false
	}
	user, err := readString(c)
	if err != nil {
		return false
	}
	pass, err := readString(c)
	if err != nil {
		return false
	}
	ok := fault != RejectAuth && user == s.o.Username && pass == s.o.Password
	status := byte(1)
	if ok {
		status = 0
	}
	_, err = c.Write([]byte{0x01, status})
	return ok && err == nil
}

// readString reads a length byte and that many bytes.
func readString(r io.Reader) (string, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	b := make([]byte, n[0])
	_, err := io.ReadFull(r, b)
	return string(b), err
}

// readTarget reads ATYP, DST.ADDR and DST.PORT as host:port.
func readTarget(r io.Reader) (string, error) {
	var atyp [1]byte
	if _, err := io.ReadFull(r, atyp[:]); err != nil {
		return "", err
	}
	var host string
	switch atyp[0] {
	case 0x01:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return "", err
		}
		host = netip.AddrFrom4(b).String()
	case 0x04:
		var b [16]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return "", err
		}
		host = netip.AddrFrom16(b).String()
	case 0x03:
		h, err := readString(r)
		if err != nil {
			return "", err
		}
		host = h
	default:
		return "", errors.New("unknown address type")
	}
	var p [2]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(p[:])))), nil
}

// appendAddr appends ATYP, ADDR and PORT for an IP address.
func appendAddr(b []byte, ap netip.AddrPort) []byte {
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		a := ip.As4()
		b = append(append(b, 0x01), a[:]...)
	} else {
		a := ip.As16()
		b = append(append(b, 0x04), a[:]...)
	}
	return binary.BigEndian.AppendUint16(b, ap.Port())
}

func reply(c net.Conn, rep byte, bound netip.AddrPort) error {
	if !bound.IsValid() {
		bound = netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	}
	_, err := c.Write(appendAddr([]byte{version, rep, 0x00}, bound))
	return err
}

func (s *Server) connect(c net.Conn, target string, fault Fault) {
	s.mu.Lock()
	s.connects = append(s.connects, target)
	s.mu.Unlock()
	if fault == RefuseConnect {
		reply(c, repRefused, netip.AddrPort{})
		return
	}
	if s.o.HoldConnect != nil {
		<-s.o.HoldConnect
	}
	up, err := net.DialTimeout("tcp", target, dialTimeout)
	if err != nil {
		reply(c, replyCode(err), netip.AddrPort{})
		return
	}
	if !s.track(up) {
		return
	}
	defer s.release(up)
	if reply(c, repSuccess, up.LocalAddr().(*net.TCPAddr).AddrPort()) != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		pipe(up, c)
		close(done)
	}()
	pipe(c, up)
	<-done
}

// pipe copies src to dst and then half-closes dst, so each direction ends
// on its own. Over TLS, as a TLS terminator in front of a SOCKS5 server
// sees it, src ends with its TCP stream: close_notify alone ends nothing.
func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if tc, ok := src.(*tls.Conn); ok {
		_, _ = io.Copy(io.Discard, tc.NetConn())
	}
	closeWrite(dst)
}

// closeWrite ends the sending direction of c, a TCP connection or TLS over
// one: close_notify first, then the TCP stream.
func closeWrite(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		tc.CloseWrite()
		c = tc.NetConn()
	}
	c.(*net.TCPConn).CloseWrite()
}

func replyCode(err error) byte {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return repRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return repNetUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH):
		return repHostUnreachable
	}
	return repFailure
}
