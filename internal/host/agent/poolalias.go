package agent

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/host/runtime"
)

// aliasDriver is the host's driver as the agent calls it: an execution
// bound to a warm pool entry is served by the entry's runtime ID, which
// it passes to the driver in place of the execution's ID. The errors it
// returns name the execution, as a user reads them (in a guest
// observation, a failure), never the entry.
type aliasDriver struct {
	runtime.Driver
	pool *warmPool
}

func (d aliasDriver) Start(ctx context.Context, spec runtime.Spec) error {
	id := spec.ID
	spec.ID = d.pool.runtimeID(id)
	return renamed(d.Driver.Start(ctx, spec), spec.ID, id)
}

func (d aliasDriver) Probe(ctx context.Context, id string) error {
	rid := d.pool.runtimeID(id)
	return renamed(d.Driver.Probe(ctx, rid), rid, id)
}

func (d aliasDriver) CheckGuest(ctx context.Context, id string) (runtime.GuestCheck, error) {
	rid := d.pool.runtimeID(id)
	c, err := d.Driver.CheckGuest(ctx, rid)
	c.ProbeErr = renamed(c.ProbeErr, rid, id)
	return c, renamed(err, rid, id)
}

func (d aliasDriver) KillLargestProcess(ctx context.Context, id string) (runtime.GuestProcess, error) {
	rid := d.pool.runtimeID(id)
	p, err := d.Driver.KillLargestProcess(ctx, rid)
	return p, renamed(err, rid, id)
}

func (d aliasDriver) Status(ctx context.Context, id string) (runtime.Status, error) {
	rid := d.pool.runtimeID(id)
	st, err := d.Driver.Status(ctx, rid)
	return st, renamed(err, rid, id)
}

func (d aliasDriver) Wait(ctx context.Context, id string) (runtime.Status, error) {
	rid := d.pool.runtimeID(id)
	st, err := d.Driver.Wait(ctx, rid)
	return st, renamed(err, rid, id)
}

func (d aliasDriver) Stop(ctx context.Context, id string, mode runtime.StopMode, grace time.Duration) (runtime.StopResult, error) {
	rid := d.pool.runtimeID(id)
	res, err := d.Driver.Stop(ctx, rid, mode, grace)
	return res, renamed(err, rid, id)
}

func (d aliasDriver) SetMemory(ctx context.Context, id string, bytes uint64) error {
	rid := d.pool.runtimeID(id)
	return renamed(d.Driver.SetMemory(ctx, rid, bytes), rid, id)
}

func (d aliasDriver) SetCPU(ctx context.Context, id string, millis uint32) error {
	rid := d.pool.runtimeID(id)
	return renamed(d.Driver.SetCPU(ctx, rid, millis), rid, id)
}

func (d aliasDriver) VolumeUsage(ctx context.Context, id string) (used, capacity uint64, err error) {
	rid := d.pool.runtimeID(id)
	used, capacity, err = d.Driver.VolumeUsage(ctx, rid)
	return used, capacity, renamed(err, rid, id)
}

func (d aliasDriver) Metrics(ctx context.Context, id string) (runtime.Metrics, error) {
	rid := d.pool.runtimeID(id)
	m, err := d.Driver.Metrics(ctx, rid)
	return m, renamed(err, rid, id)
}

func (d aliasDriver) DialGuest(ctx context.Context, id, name string) (net.Conn, error) {
	rid := d.pool.runtimeID(id)
	c, err := d.Driver.DialGuest(ctx, rid, name)
	return c, renamed(err, rid, id)
}

// renamed is err, made by the driver for the runtime ID rid, with the
// execution's ID id in its text; errors.Is and As still see err.
func renamed(err error, rid, id string) error {
	if err == nil || rid == id || !strings.Contains(err.Error(), rid) {
		return err
	}
	return &renamedError{err: err, text: strings.ReplaceAll(err.Error(), rid, id)}
}

type renamedError struct {
	err  error
	text string
}

func (e *renamedError) Error() string { return e.text }
func (e *renamedError) Unwrap() error { return e.err }

// Recover returns the executions still running under their execution
// IDs, and releases the pool entries no execution was bound to.
func (d aliasDriver) Recover(ctx context.Context) ([]string, error) {
	running, err := d.Driver.Recover(ctx)
	ids, perr := d.pool.recover(ctx, running)
	return ids, errors.Join(err, perr)
}
