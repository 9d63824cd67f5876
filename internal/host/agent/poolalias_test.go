package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/host/runtime"
)

// probeFailing is a driver whose guest checks fail naming the ID they
// were given, as the OCI driver's do.
type probeFailing struct{ runtime.Driver }

func (probeFailing) CheckGuest(_ context.Context, id string) (runtime.GuestCheck, error) {
	return runtime.GuestCheck{ProbeErr: fmt.Errorf("guest agent of %s: %w", id, os.ErrDeadlineExceeded)}, nil
}

func (probeFailing) Probe(_ context.Context, id string) error {
	return fmt.Errorf("runc state %s: %w", id, fs.ErrNotExist)
}

// TestAliasDriverNamesTheExecution: what the driver says of a warm pool
// entry bound to an execution names the execution (a user reads it in the
// workspace's guest observation), and keeps what it wraps.
func TestAliasDriverNamesTheExecution(t *testing.T) {
	pool := &warmPool{aliases: map[string]string{"ws_1-1": "pool-0123"}}
	d := aliasDriver{Driver: probeFailing{}, pool: pool}
	c, _ := d.CheckGuest(context.Background(), "ws_1-1")
	if got := c.ProbeErr.Error(); got != "guest agent of ws_1-1: i/o timeout" || !errors.Is(c.ProbeErr, os.ErrDeadlineExceeded) {
		t.Errorf("probe error %q (%v)", got, c.ProbeErr)
	}
	if err := d.Probe(context.Background(), "ws_1-1"); strings.Contains(err.Error(), "pool-") || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Probe: %v", err)
	}
	if c, _ := d.CheckGuest(context.Background(), "ws_2-1"); c.ProbeErr.Error() != "guest agent of ws_2-1: i/o timeout" {
		t.Errorf("an execution of its own: %v", c.ProbeErr)
	}
}
