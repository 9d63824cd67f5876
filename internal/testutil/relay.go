package testutil

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Relay carries TCP connections from a loopback address of its own to a
// server, until Cut closes its listener and every connection, as a server
// that goes away, or a network that parts, does; Heal listens again on
// the same address.
type Relay struct {
	t     testing.TB
	addr  string
	to    string
	mu    sync.Mutex
	ln    net.Listener
	cut   bool // since Cut, until Heal
	conns []net.Conn
}

// NewRelay starts a Relay to the server at addr; it ends with the test.
func NewRelay(t testing.TB, addr string) *Relay {
	t.Helper()
	r := &Relay{t: t, to: addr}
	r.listen("127.0.0.1:0")
	r.addr = r.ln.Addr().String()
	t.Cleanup(r.Cut)
	return r
}

// Addr is the address the relay listens on.
func (r *Relay) Addr() string { return r.addr }

func (r *Relay) listen(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.ln, r.cut = ln, false
	r.mu.Unlock()
	go r.serve(ln)
}

func (r *Relay) serve(ln net.Listener) {
	for {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", r.to)
		if err != nil {
			in.Close()
			continue
		}
		r.mu.Lock()
		if r.ln != ln || r.cut {
			r.mu.Unlock()
			in.Close()
			out.Close()
			continue
		}
		r.conns = append(r.conns, in, out)
		r.mu.Unlock()
		go func() { io.Copy(out, in); out.Close() }()
		go func() { io.Copy(in, out); in.Close() }()
	}
}

// Cut closes the relay's listener and every connection it carries.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = true
	r.ln.Close()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// Heal listens again, on the same address, after Cut.
func (r *Relay) Heal() { r.listen(r.addr) }
