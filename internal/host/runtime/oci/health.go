package oci

import (
	"context"
	"errors"
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
// It runs no runc command, so that probing every execution of a host
// every few seconds costs a socket round trip and two small cgroup file
// reads each.
func (d *Driver) CheckGuest(ctx context.Context, id string) (runtime.GuestCheck, error) {
	if err := checkID(id); err != nil {
		return runtime.GuestCheck{}, err
	}
	if _, err := os.Stat(d.dir(id)); errors.Is(err, os.ErrNotExist) {
		return runtime.GuestCheck{}, runtime.ErrNotFound
	}
	var c runtime.GuestCheck
	c.BootID, c.ProbeErr = d.ping(ctx, id)
	// Read after the answer, so the count covers every kill before it.
	c.OOMKills, _ = oomKills(id)
	c.MemoryPressure = memoryPressure(id)
	return c, nil
}

// probeConn is a connection to a guest agent's probe socket kept between
// periodic probes: the agent answers any number of PINGs on one, and a
// dial (the socket directory's and the socket's opens, connect, the
// agent's accept) cost more than the exchange.
type probeConn struct {
	mu sync.Mutex // one exchange at a time
	c  net.Conn
	r  *guestabi.ProbeReader
}

// ping asks the agent of execution id whether it is ready and returns its
// boot ID, over the execution's kept probe connection. A kept connection
// that fails other than by ctx (the guest reset, and its agent is a new
// process) is closed and the agent dialled once more, so that a stale
// connection never reads as an unresponsive guest; one that timed out is
// closed, since its answer may still come and would answer the next PING.
func (d *Driver) ping(ctx context.Context, id string) (string, error) {
	if p := d.keptProbe(id); p != nil {
		boot, err := p.exchange(ctx, guestabi.CommandPing, guestabi.AnswerReady)
		if err == nil {
			return boot, nil
		}
		d.dropProbe(id, p)
		if ctx.Err() != nil {
			return "", fmt.Errorf("oci: guest agent of %s: %w", id, err)
		}
	}
	c, err := d.dialAgent(ctx, id)
	if err != nil {
		return "", fmt.Errorf("oci: guest agent of %s: %w", id, err)
	}
	p := &probeConn{c: c, r: guestabi.NewProbeReader(c)}
	boot, err := p.exchange(ctx, guestabi.CommandPing, guestabi.AnswerReady)
	if err != nil {
		c.Close()
		return "", fmt.Errorf("oci: guest agent of %s: %w", id, err)
	}
	d.keepProbe(id, p)
	return boot, nil
}

// exchange sends one command line and checks that the answer is want,
// within ctx; it returns the answer's argument.
func (p *probeConn) exchange(ctx context.Context, command, want string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
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

// keptProbe returns the kept probe connection of execution id, or nil.
func (d *Driver) keptProbe(id string) *probeConn {
	d.probesMu.Lock()
	defer d.probesMu.Unlock()
	return d.probes[id]
}

// keepProbe keeps p as execution id's probe connection, unless the
// execution's directory is gone (released while p was dialled: release
// drops the connection after it removes the directory, and both run
// under probesMu) or another connection is kept already.
func (d *Driver) keepProbe(id string, p *probeConn) {
	d.probesMu.Lock()
	defer d.probesMu.Unlock()
	if _, err := os.Stat(d.dir(id)); err != nil || d.probes[id] != nil {
		p.c.Close()
		return
	}
	d.probes[id] = p
}

// dropProbe closes the kept probe connection of execution id; when p is
// not nil, only if it is still the one kept.
func (d *Driver) dropProbe(id string, p *probeConn) {
	d.probesMu.Lock()
	defer d.probesMu.Unlock()
	kept := d.probes[id]
	if kept == nil || p != nil && kept != p {
		return
	}
	delete(d.probes, id)
	kept.c.Close()
}
