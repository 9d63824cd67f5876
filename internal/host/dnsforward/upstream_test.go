package dnsforward

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/miekg/dns"
)

// The test upstreams answer from one zone:
//
//	example.test.    A 192.0.2.1
//	broken.test.     SERVFAIL
//	truncated.test.  an empty answer with the TC bit
//	many.test.       60 A records
//	big.test.        60 A records over TCP, over UDP an empty answer with
//	                 the TC bit (as an upstream does when they do not fit)
//	anything else    NXDOMAIN
func zoneReply(r *dns.Msg, overUDP bool) *dns.Msg {
	m := new(dns.Msg).SetReply(r)
	name := r.Question[0].Name
	switch name {
	case "big.test.":
		if overUDP {
			m.Truncated = true
			break
		}
		for i := range 60 {
			m.Answer = append(m.Answer, aRecord(name, byte(i)))
		}
	case "example.test.":
		m.Answer = append(m.Answer, aRecord(name, 1))
	case "broken.test.":
		m.Rcode = dns.RcodeServerFailure
	case "truncated.test.":
		m.Truncated = true
	case "many.test.":
		for i := range 60 {
			m.Answer = append(m.Answer, aRecord(name, byte(i)))
		}
	default:
		m.Rcode = dns.RcodeNameError
	}
	return m
}

func aRecord(name string, last byte) dns.RR {
	return &dns.A{
		Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
		A:   net.IPv4(192, 0, 2, last),
	}
}

// serve runs srv with the zone until the test ends.
func serve(t *testing.T, srv *dns.Server) {
	t.Helper()
	srv.Handler = dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		w.WriteMsg(zoneReply(r, w.RemoteAddr().Network() == "udp"))
	})
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	failed := make(chan error, 1)
	go func() { failed <- srv.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-failed:
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown() })
}

// dualUpstream serves the zone over UDP and TCP at one address and
// returns it.
func dualUpstream(t *testing.T) string {
	t.Helper()
	ln := listenTCP(t)
	pc, err := net.ListenPacket("udp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	serve(t, &dns.Server{PacketConn: pc})
	serve(t, &dns.Server{Listener: ln})
	return ln.Addr().String()
}

// udpUpstream serves the zone over UDP and returns its address.
func udpUpstream(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, &dns.Server{PacketConn: pc})
	return pc.LocalAddr().String()
}

// tcpUpstream serves the zone over TCP, in TLS with serverTLS when it is set,
// and returns its address.
func tcpUpstream(t *testing.T, serverTLS *tls.Config) string {
	t.Helper()
	ln := listenTCP(t)
	if serverTLS != nil {
		ln = tls.NewListener(ln, serverTLS)
	}
	serve(t, &dns.Server{Listener: ln})
	return ln.Addr().String()
}

// httpsUpstream serves the zone over DoH at /dns-query, answers 500 at
// /fail, and returns the server's base URL.
func httpsUpstream(t *testing.T, serverTLS *tls.Config) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /dns-query", func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Content-Type") != "application/dns-message" {
			http.Error(w, "bad content type", http.StatusUnsupportedMediaType)
			return
		}
		body, err := io.ReadAll(req.Body)
		var q dns.Msg
		if err == nil {
			err = q.Unpack(body)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		b, err := zoneReply(&q, false).Pack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/dns-message")
		w.Write(b)
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream broken", http.StatusInternalServerError)
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.TLS = serverTLS
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

func listenTCP(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// closedPort returns a loopback address of network ("udp" or "tcp") that
// nothing listens on.
func closedPort(t *testing.T, network string) string {
	t.Helper()
	var addr string
	if network == "udp" {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = pc.LocalAddr().String()
		pc.Close()
	} else {
		ln := listenTCP(t)
		addr = ln.Addr().String()
		ln.Close()
	}
	return addr
}
