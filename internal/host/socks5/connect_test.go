package socks5_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/host/socks5"
	"github.com/kibotos/kibotos/internal/host/socks5/socks5test"
	"github.com/kibotos/kibotos/internal/testutil/fakeresolver"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

func TestConnect(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	for _, tc := range []struct {
		name       string
		server     socks5test.Options
		user, pass string
	}{
		{name: "no authentication"},
		{name: "authentication", server: socks5test.Options{Username: user, Password: password}, user: user, pass: password},
		{name: "credentials offered to an endpoint that needs none", user: user, pass: password},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := socks5test.Start(t, "127.0.0.1:0", tc.server)
			d := &socks5.Dialer{Endpoint: socks5.Endpoint{Address: srv.Addr(), Username: tc.user, Password: tc.pass}}
			c, err := d.DialContext(t.Context(), "tcp", echo)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			roundTrip(t, c, "hello")
			roundTrip(t, c, "again")
			if got := srv.Connects(); !slices.Equal(got, []string{echo}) {
				t.Errorf("Connects() = %q, want [%q]", got, echo)
			}
		})
	}
}

func TestConnectAuthenticationRejected(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{Username: user, Password: password + "-other"})
	_, err := dialer(srv).DialContext(t.Context(), "tcp", echo)
	wantKind(t, err, socks5.AuthenticationFailed)
	if len(srv.Connects()) != 0 {
		t.Errorf("Connects() = %q after a rejected authentication", srv.Connects())
	}
}

func TestConnectWithoutCredentialsToAnAuthenticatingEndpoint(t *testing.T) {
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{Username: user, Password: password})
	d := &socks5.Dialer{Endpoint: socks5.Endpoint{Address: srv.Addr()}}
	_, err := d.DialContext(t.Context(), "tcp", echoTCP(t, "127.0.0.1:0"))
	wantKind(t, err, socks5.HandshakeFailed)
}

// TestConnectDestinations checks that the destination arrives at the
// endpoint as given: an IPv4 or IPv6 literal as an address, a hostname as a
// name the endpoint resolves.
func TestConnectDestinations(t *testing.T) {
	requireIPv6(t)
	echo4 := echoTCP(t, "127.0.0.1:0")
	echo6 := echoTCP(t, "[::1]:0")
	_, port, _ := net.SplitHostPort(echo4)
	for _, dest := range []string{echo4, echo6, net.JoinHostPort("localhost", port)} {
		t.Run(dest, func(t *testing.T) {
			srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{})
			c, err := dialer(srv).DialContext(t.Context(), "tcp", dest)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			roundTrip(t, c, "ping")
			if got := srv.Connects(); !slices.Equal(got, []string{dest}) {
				t.Errorf("Connects() = %q, want [%q]", got, dest)
			}
		})
	}
}

// TestRequestEncoding checks the bytes on the wire against RFC 1928 and
// RFC 1929.
func TestRequestEncoding(t *testing.T) {
	for _, tc := range []struct {
		network, address string
		request          []byte // after VER CMD RSV
	}{
		{"tcp", "192.0.2.1:80", []byte{0x01, 192, 0, 2, 1, 0, 80}},
		{"tcp", "[2001:db8::1]:443", []byte{0x04, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x01, 0xbb}},
		{"tcp", "[::ffff:192.0.2.1]:53", []byte{0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1, 0, 53}},
		{"tcp", "example.test:8080", append([]byte{0x03, 12}, "example.test\x1f\x90"...)},
		// UDP ASSOCIATE names no client address: all zeros.
		{"udp", "192.0.2.1:53", []byte{0x01, 0, 0, 0, 0, 0, 0}},
	} {
		t.Run(tc.network+" "+tc.address, func(t *testing.T) {
			cmd := byte(0x01)
			if tc.network == "udp" {
				cmd = 0x03
			}
			addr := rawEndpoint(t, func(c net.Conn) error {
				if err := expect(c, "greeting", []byte{5, 2, 0x00, 0x02}); err != nil {
					return err
				}
				c.Write([]byte{5, 0x02})
				auth := append(append([]byte{1, byte(len(user))}, user...), byte(len(password)))
				if err := expect(c, "authentication", append(auth, password...)); err != nil {
					return err
				}
				c.Write([]byte{1, 0})
				if err := expect(c, "request", append([]byte{5, cmd, 0}, tc.request...)); err != nil {
					return err
				}
				// Success, with the relay on the endpoint's own address.
				c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0x30, 0x39})
				return nil
			})
			d := &socks5.Dialer{Endpoint: socks5.Endpoint{Address: addr, Username: user, Password: password}}
			c, err := d.DialContext(t.Context(), tc.network, tc.address)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		})
	}
}

func TestTLS(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	cfg, ca := testtls.New(t, "proxy.test", "127.0.0.1")
	_, otherCA := testtls.New(t, "proxy.test")
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{Username: user, Password: password, TLS: cfg})
	for _, tc := range []struct {
		name string
		tls  socks5.TLS
		want socks5.Kind // zero: the dial succeeds
	}{
		{name: "server name and CA", tls: socks5.TLS{ServerName: "proxy.test", CACertPEM: ca}},
		{name: "server name from the address", tls: socks5.TLS{CACertPEM: ca}},
		{name: "wrong CA", tls: socks5.TLS{ServerName: "proxy.test", CACertPEM: otherCA}, want: socks5.TLSVerificationFailed},
		{name: "system roots", tls: socks5.TLS{ServerName: "proxy.test"}, want: socks5.TLSVerificationFailed},
		{name: "wrong server name", tls: socks5.TLS{ServerName: "other.test", CACertPEM: ca}, want: socks5.TLSVerificationFailed},
		{name: "CA that is not PEM", tls: socks5.TLS{CACertPEM: "not a certificate"}, want: socks5.TLSVerificationFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := dialer(srv)
			d.Endpoint.TLS = &tc.tls
			c, err := d.DialContext(t.Context(), "tcp", echo)
			if tc.want != 0 {
				wantKind(t, err, tc.want)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, ok := c.(*socks5.TLSStream); !ok {
				t.Errorf("the conn is a %T, want a *socks5.TLSStream", c)
			}
			roundTrip(t, c, "over tls")
		})
	}
}

func TestTLSMismatch(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	cfg, ca := testtls.New(t, "127.0.0.1")
	t.Run("TLS to a plain endpoint", func(t *testing.T) {
		d := dialer(socks5test.Start(t, "127.0.0.1:0", socks5test.Options{}))
		d.Endpoint.TLS = &socks5.TLS{CACertPEM: ca}
		_, err := d.DialContext(t.Context(), "tcp", echo)
		wantKind(t, err, socks5.HandshakeFailed)
	})
	t.Run("plain to a TLS endpoint", func(t *testing.T) {
		d := dialer(socks5test.Start(t, "127.0.0.1:0", socks5test.Options{TLS: cfg}))
		d.HandshakeTimeout = time.Second // the TLS server waits for a full record header
		_, err := d.DialContext(t.Context(), "tcp", echo)
		wantKind(t, err, socks5.HandshakeFailed)
	})
}

// TestFaults maps each fault of the test server to the Kind it must cause,
// over plain TCP and over TLS.
func TestFaults(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	udpEcho := echoUDP(t, "127.0.0.1:0")
	cfg, ca := testtls.New(t, "127.0.0.1")
	for _, tc := range []struct {
		fault   socks5test.Fault
		network string
		want    socks5.Kind
	}{
		{socks5test.RejectAuth, "tcp", socks5.AuthenticationFailed},
		{socks5test.NoAcceptableMethod, "tcp", socks5.HandshakeFailed},
		{socks5test.Garbage, "tcp", socks5.HandshakeFailed},
		{socks5test.Hang, "tcp", socks5.HandshakeFailed},
		{socks5test.CloseAfterGreeting, "tcp", socks5.HandshakeFailed},
		{socks5test.CloseAfterGreeting, "udp", socks5.HandshakeFailed},
		{socks5test.RefuseConnect, "tcp", socks5.DestinationFailed},
		{socks5test.RefuseUDP, "udp", socks5.UDPAssociationFailed},
		{socks5test.DeadRelay, "udp", socks5.UDPAssociationFailed},
	} {
		for _, overTLS := range []bool{false, true} {
			name := fmt.Sprintf("%v %s tls=%v", tc.fault, tc.network, overTLS)
			t.Run(name, func(t *testing.T) {
				o := socks5test.Options{Username: user, Password: password, UDP: true, Fault: tc.fault}
				if overTLS {
					o.TLS = cfg
				}
				srv := socks5test.Start(t, "127.0.0.1:0", o)
				d := dialer(srv)
				if tc.fault == socks5test.Hang {
					d.HandshakeTimeout = time.Second
				}
				if overTLS {
					d.Endpoint.TLS = &socks5.TLS{CACertPEM: ca}
				}
				dest := echo
				if tc.network == "udp" {
					dest = udpEcho
				}
				c, err := d.DialContext(t.Context(), tc.network, dest)
				if err == nil {
					// Only the relay's failure shows after the dial.
					defer c.Close()
					c.SetDeadline(time.Now().Add(ioTimeout))
					if _, err = c.Write([]byte("ping")); err == nil {
						_, err = c.Read(make([]byte, 64))
					}
				}
				e := wantKind(t, err, tc.want)
				switch tc.fault {
				case socks5test.Hang:
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Errorf("err = %v, want a timeout", err)
					}
				case socks5test.RefuseConnect:
					var rep socks5.ReplyCode
					if !errors.As(err, &rep) || rep != 0x05 || !strings.Contains(e.Error(), "connection refused") {
						t.Errorf("err = %v, want reply 0x05 (connection refused)", err)
					}
					if got := srv.Connects(); !slices.Equal(got, []string{echo}) {
						t.Errorf("Connects() = %q, want [%q]", got, echo)
					}
				}
			})
		}
	}
}

// TestSetFault checks that a server made healthy serves the next dial.
func TestSetFault(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{Username: user, Password: password, Fault: socks5test.RejectAuth})
	_, err := dialer(srv).DialContext(t.Context(), "tcp", echo)
	wantKind(t, err, socks5.AuthenticationFailed)
	srv.SetFault(socks5test.None)
	c, err := dialer(srv).DialContext(t.Context(), "tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "healthy")
}

func TestEndpointUnreachable(t *testing.T) {
	d := &socks5.Dialer{Endpoint: socks5.Endpoint{Address: closedPort(t), Username: user, Password: password}}
	_, err := d.DialContext(t.Context(), "tcp", "192.0.2.1:80")
	wantKind(t, err, socks5.EndpointUnreachable)

	r := fakeresolver.Failing(&net.DNSError{Err: "no such host", Name: "proxy.test", IsNotFound: true})
	d = &socks5.Dialer{Endpoint: socks5.Endpoint{Address: "proxy.test:1080"}, Resolver: r}
	_, err = d.DialContext(t.Context(), "tcp", "192.0.2.1:80")
	wantKind(t, err, socks5.EndpointUnreachable)
}

// TestCheckRemovesEveryAddress checks that a dial whose addresses the check
// all refuses fails without connecting.
func TestCheckRemovesEveryAddress(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{Username: user, Password: password})
	_, port, _ := net.SplitHostPort(srv.Addr())

	rec := &checkRecorder{refuse: func(netip.Addr) bool { return true }}
	d := dialer(srv)
	d.Check = rec.check
	_, err := d.DialContext(t.Context(), "tcp", echo)
	if e := wantKind(t, err, socks5.EndpointUnreachable); !errors.Is(e, errRefused) {
		t.Errorf("err = %v, want it to wrap the check's error", err)
	}

	both := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}
	d.Endpoint.Address = net.JoinHostPort("proxy.test", port)
	d.Resolver = fakeresolver.New(map[string][]netip.Addr{"proxy.test": both})
	_, err = d.DialContext(t.Context(), "tcp", echo)
	wantKind(t, err, socks5.EndpointUnreachable)
	want := append([]netip.Addr{netip.MustParseAddr("127.0.0.1")}, both...)
	if got := rec.addrs(); !slices.Equal(got, want) {
		t.Errorf("checked %v, want %v", got, want)
	}

	// A dial that connects queues behind any earlier connection, so once it
	// succeeds the count says whether the refused dials connected.
	c, err := dialer(srv).DialContext(t.Context(), "tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if n := srv.Accepted(); n != 1 {
		t.Errorf("the endpoint accepted %d connections, want 1", n)
	}
}

// TestHostnameEndpointResolvedPerDial checks that each dial resolves the
// endpoint's hostname again and checks its new addresses.
func TestHostnameEndpointResolvedPerDial(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{Username: user, Password: password})
	_, port, _ := net.SplitHostPort(srv.Addr())
	v6, v4 := netip.MustParseAddr("::1"), netip.MustParseAddr("127.0.0.1")
	r := fakeresolver.New(map[string][]netip.Addr{"localhost": {v6}})
	rec := &checkRecorder{}
	d := dialer(srv)
	d.Endpoint.Address = net.JoinHostPort("localhost", port)
	d.Resolver = r
	d.Check = rec.check

	// Nothing listens on [::1]:port.
	_, err := d.DialContext(t.Context(), "tcp", echo)
	wantKind(t, err, socks5.EndpointUnreachable)
	r.Set("localhost", v4)
	c, err := d.DialContext(t.Context(), "tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "resolved again")
	var lookups []string
	for _, l := range r.Lookups() {
		lookups = append(lookups, l.Network+" "+l.Host)
	}
	if want := []string{"ip localhost", "ip localhost"}; !slices.Equal(lookups, want) {
		t.Errorf("lookups = %q, want %q", lookups, want)
	}
	if got, want := rec.addrs(), []netip.Addr{v6, v4}; !slices.Equal(got, want) {
		t.Errorf("checked %v, want %v", got, want)
	}
}

// TestDefaultResolver checks that a nil Resolver resolves with the system.
func TestDefaultResolver(t *testing.T) {
	echo := echoTCP(t, "127.0.0.1:0")
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{})
	_, port, _ := net.SplitHostPort(srv.Addr())
	d := &socks5.Dialer{Endpoint: socks5.Endpoint{Address: net.JoinHostPort("localhost", port)}}
	c, err := d.DialContext(t.Context(), "tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "localhost")
}

// TestDialAbandoned checks that a dial the caller gives up on is not
// blamed on the endpoint.
func TestDialAbandoned(t *testing.T) {
	srv := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{Fault: socks5test.Hang})
	d := dialer(srv)
	d.HandshakeTimeout = time.Minute
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := d.DialContext(ctx, "tcp", "192.0.2.1:80")
	wantPlain(t, err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want it to wrap context.DeadlineExceeded", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the dial took %v after its context ended", el)
	}

	ctx, cancel = context.WithCancel(t.Context())
	cancel()
	_, err = d.DialContext(ctx, "tcp", "192.0.2.1:80")
	wantPlain(t, err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want it to wrap context.Canceled", err)
	}
}

func TestInvalidArguments(t *testing.T) {
	d := &socks5.Dialer{Endpoint: socks5.Endpoint{Address: closedPort(t), Username: user, Password: password}}
	for _, tc := range []struct{ network, address string }{
		{"ip", "192.0.2.1:80"},
		{"tcp", "192.0.2.1"},
		{"tcp", "192.0.2.1:http"},
		{"tcp", "[fe80::1%eth0]:80"},
		{"tcp", ":80"},
		{"tcp", strings.Repeat("a", 256) + ":80"},
	} {
		_, err := d.DialContext(t.Context(), tc.network, tc.address)
		wantPlain(t, err)
	}
	long := *d
	long.Endpoint.Password = strings.Repeat("p", 256)
	_, err := long.DialContext(t.Context(), "tcp", "192.0.2.1:80")
	wantPlain(t, err)
	bad := *d
	bad.Endpoint.Address = "no-port"
	_, err = bad.DialContext(t.Context(), "tcp", "192.0.2.1:80")
	wantPlain(t, err)
}
