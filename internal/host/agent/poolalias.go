package agent

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/kibotos/kibotos/internal/host/runtime"
)

// aliasDriver is the host's driver as the agent calls it: an execution
// bound to a warm pool entry is served by the entry's runtime ID, which
// it passes to the driver in place of the execution's ID.
type aliasDriver struct {
	runtime.Driver
	pool *warmPool
}

func (d aliasDriver) Start(ctx context.Context, spec runtime.Spec) error {
	spec.ID = d.pool.runtimeID(spec.ID)
	return d.Driver.Start(ctx, spec)
}

func (d aliasDriver) Probe(ctx context.Context, id string) error {
	return d.Driver.Probe(ctx, d.pool.runtimeID(id))
}

func (d aliasDriver) CheckGuest(ctx context.Context, id string) (runtime.GuestCheck, error) {
	return d.Driver.CheckGuest(ctx, d.pool.runtimeID(id))
}

func (d aliasDriver) KillLargestProcess(ctx context.Context, id string) (runtime.GuestProcess, error) {
	return d.Driver.KillLargestProcess(ctx, d.pool.runtimeID(id))
}

func (d aliasDriver) Status(ctx context.Context, id string) (runtime.Status, error) {
	return d.Driver.Status(ctx, d.pool.runtimeID(id))
}

func (d aliasDriver) Wait(ctx context.Context, id string) (runtime.Status, error) {
	return d.Driver.Wait(ctx, d.pool.runtimeID(id))
}

func (d aliasDriver) Stop(ctx context.Context, id string, mode runtime.StopMode, grace time.Duration) (runtime.StopResult, error) {
	return d.Driver.Stop(ctx, d.pool.runtimeID(id), mode, grace)
}

func (d aliasDriver) SetMemory(ctx context.Context, id string, bytes uint64) error {
	return d.Driver.SetMemory(ctx, d.pool.runtimeID(id), bytes)
}

func (d aliasDriver) SetCPU(ctx context.Context, id string, millis uint32) error {
	return d.Driver.SetCPU(ctx, d.pool.runtimeID(id), millis)
}

func (d aliasDriver) VolumeUsage(ctx context.Context, id string) (used, capacity uint64, err error) {
	return d.Driver.VolumeUsage(ctx, d.pool.runtimeID(id))
}

func (d aliasDriver) Metrics(ctx context.Context, id string) (runtime.Metrics, error) {
	return d.Driver.Metrics(ctx, d.pool.runtimeID(id))
}

func (d aliasDriver) DialGuest(ctx context.Context, id, name string) (net.Conn, error) {
	return d.Driver.DialGuest(ctx, d.pool.runtimeID(id), name)
}

// Recover returns the executions still running under their execution
// IDs, and releases the pool entries no execution was bound to.
func (d aliasDriver) Recover(ctx context.Context) ([]string, error) {
	running, err := d.Driver.Recover(ctx)
	ids, perr := d.pool.recover(ctx, running)
	return ids, errors.Join(err, perr)
}
