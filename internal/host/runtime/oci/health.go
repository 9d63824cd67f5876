package oci

import (
	"context"
	"errors"
	"os"

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
	c.BootID, c.ProbeErr = d.agentCommand(ctx, id, guestabi.CommandPing, guestabi.AnswerReady)
	// Read after the answer, so the count covers every kill before it.
	c.OOMKills, _ = oomKills(id)
	c.MemoryPressure = memoryPressure(id)
	return c, nil
}
