package oci

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// CheckGuest probes the guest agent (PING → READY <boot-id>) and reads the
// execution's OOM kill counter and memory pressure; see runtime.Driver.
// It runs no runc command, and what it opens it keeps for the next check
// (guestProbe), so that probing every execution of a host every few
// seconds costs a socket round trip and two small reads each.
func (d *Driver) CheckGuest(ctx context.Context, id string) (runtime.GuestCheck, error) {
	if err := checkID(id); err != nil {
		return runtime.GuestCheck{}, err
	}
	p := d.guestProbe(id)
	if p == nil {
		return runtime.GuestCheck{}, runtime.ErrNotFound
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return runtime.GuestCheck{}, runtime.ErrNotFound // released meanwhile
	}
	var c runtime.GuestCheck
	c.BootID, c.ProbeErr = p.ping(ctx, d, id)
	// Read after the answer, so the count covers every kill before it.
	p.oom.read(oomKillFiles(id), func(b []byte) (ok bool) {
		c.OOMKills, ok = oomKillCount(b)
		return ok
	})
	c.MemoryPressure = p.pressure.readPressure(pressureFiles(id))
	return c, nil
}

// guestProbe is what CheckGuest keeps of one execution between checks: a
// connection to the guest agent's probe socket (the agent answers any
// number of PINGs on one, and a dial, with the socket directory's and the
// socket's opens, connect and the agent's accept, cost more than the
// exchange) and the cgroup files it reads, read again from their start
// (a path lookup in the cgroup tree cost more than the read). Release
// closes it.
type guestProbe struct {
	mu     sync.Mutex // one check at a time
	closed bool
	conn   *probeConn // nil until dialled, and after a failure
	oom    cgroupFile
	// pressure is the execution's memory.pressure.
	pressure cgroupFile
}

// guestProbe returns the kept probe state of execution id, made on first
// use; nil when the execution's directory is gone. The directory is
// looked at under probesMu, which release's dropProbe also holds after
// it removed the directory, so that no state outlives a release.
func (d *Driver) guestProbe(id string) *guestProbe {
	d.probesMu.Lock()
	defer d.probesMu.Unlock()
	if p := d.probes[id]; p != nil {
		return p
	}
	if _, err := os.Stat(d.dir(id)); err != nil {
		return nil
	}
	p := &guestProbe{}
	d.probes[id] = p
	return p
}

// dropProbe closes what CheckGuest keeps of execution id.
func (d *Driver) dropProbe(id string) {
	d.probesMu.Lock()
	p := d.probes[id]
	delete(d.probes, id)
	d.probesMu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.conn != nil {
		p.conn.c.Close()
		p.conn = nil
	}
	p.oom.close()
	p.pressure.close()
}

// ping asks the agent of execution id whether it is ready and returns its
// boot ID, over the kept connection. A kept connection that fails other
// than by ctx (the guest reset, and its agent is a new process) is closed
// and the agent dialled once more, so that a stale connection never reads
// as an unresponsive guest; one that timed out is closed, since its answer
// may still come and would answer the next PING.
func (p *guestProbe) ping(ctx context.Context, d *Driver, id string) (string, error) {
	if p.conn != nil {
		boot, err := p.conn.exchange(ctx, guestabi.CommandPing, guestabi.AnswerReady)
		if err == nil {
			return boot, nil
		}
		p.conn.c.Close()
		p.conn = nil
		if ctx.Err() != nil {
			return "", fmt.Errorf("oci: guest agent of %s: %w", id, err)
		}
	}
	conn, err := d.dialProbe(ctx, id)
	if err != nil {
		return "", fmt.Errorf("oci: guest agent of %s: %w", id, err)
	}
	boot, err := conn.exchange(ctx, guestabi.CommandPing, guestabi.AnswerReady)
	if err != nil {
		conn.c.Close()
		return "", fmt.Errorf("oci: guest agent of %s: %w", id, err)
	}
	p.conn = conn
	return boot, nil
}

// probeConn is a connection of the probe protocol to a guest agent.
type probeConn struct {
	c net.Conn
	r *guestabi.ProbeReader
}

// dialProbe connects to the probe socket of execution id's guest agent.
func (d *Driver) dialProbe(ctx context.Context, id string) (*probeConn, error) {
	c, err := d.DialGuest(ctx, id, agentSocket)
	if err != nil {
		return nil, err
	}
	return &probeConn{c: c, r: guestabi.NewProbeReader(c)}, nil
}

// exchange sends one command line and checks that the answer is want,
// within ctx; it returns the answer's argument.
func (p *probeConn) exchange(ctx context.Context, command, want string) (string, error) {
	dl, _ := ctx.Deadline() // the zero time when none: no deadline
	p.c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { p.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := guestabi.WriteProbeLine(p.c, command); err != nil {
		return "", ctxErr(ctx, err)
	}
	line, err := p.r.ReadLine()
	if err != nil {
		return "", ctxErr(ctx, err)
	}
	arg, ok := guestabi.ProbeAnswer(line, want)
	if !ok {
		return "", fmt.Errorf("answered %q to %s", line, command)
	}
	return arg, nil
}
