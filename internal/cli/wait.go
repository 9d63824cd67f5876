package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// defaultWaitTimeout bounds --wait unless --timeout says otherwise.
const defaultWaitTimeout = 5 * time.Minute

// goal is the state a --wait ends in.
type goal struct {
	state ctrlv1.WorkspaceState
	// via are the states from which the Workspace can still get there; any
	// other state ends the wait with an error.
	via []ctrlv1.WorkspaceState
}

var (
	untilAvailable = goal{
		state: ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE,
		via: []ctrlv1.WorkspaceState{
			ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING,
			ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING,
			ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN,
		},
	}
	untilStopped = goal{
		state: ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED,
		via: []ctrlv1.WorkspaceState{
			ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING,
			ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN,
		},
	}
	untilDeleted = goal{
		state: ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED,
		via:   []ctrlv1.WorkspaceState{ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING},
	}
)

// waitFlags are --wait and --timeout.
type waitFlags struct {
	wait    bool
	timeout time.Duration
}

func (f *waitFlags) register(cmd *cobra.Command, g goal) {
	f.registerUntil(cmd, "the Workspace until it is "+stateName(g.state))
}

// registerUntil registers the flags; until says what --wait follows.
func (f *waitFlags) registerUntil(cmd *cobra.Command, until string) {
	cmd.Flags().BoolVar(&f.wait, "wait", false, "after the call, follow "+until+
		" and show the progress on stderr; exit non-zero if it fails or the wait times out")
	cmd.Flags().DurationVar(&f.timeout, "timeout", defaultWaitTimeout, "how long --wait waits")
}

// run follows the Workspace after a call returned it, when --wait asks to.
func (f *waitFlags) run(cmd *cobra.Command, cl wsClient, ws *ctrlv1.Workspace, g goal) error {
	if !f.wait {
		return nil
	}
	return waitWorkspace(cmd.Context(), cl, ws, g, f.timeout, newStatusLine(cmd.ErrOrStderr()))
}

// waitWorkspace follows WatchWorkspace from the state the call returned
// until the Workspace reaches g. It reports state changes and the template
// delivery on out, and returns an error that says why when the Workspace
// FAILED, left the way to g, the watch ended first or timeout passed.
func waitWorkspace(ctx context.Context, cl wsClient, ws *ctrlv1.Workspace, g goal, timeout time.Duration, out *statusLine) error {
	if ws.GetState() == g.state {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r := &reporter{out: out, last: ws, since: time.Now()}
	defer out.end()
	// follow reads one watch until it ends, or until the Workspace settles
	// the wait (done).
	follow := func(stream *connect.ServerStreamForClient[ctrlv1.WatchWorkspaceResponse]) (done bool, err error) {
		defer stream.Close()
		for stream.Receive() {
			ws := stream.Msg().GetWorkspace()
			r.observe(ws)
			switch s := ws.GetState(); {
			case s == g.state:
				return true, nil
			case s == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
				return true, failureError(ws)
			case !slices.Contains(g.via, s):
				return true, fmt.Errorf("workspace %s is %s and will not become %s", ws.GetWorkspaceId(), stateName(s), stateName(g.state))
			}
		}
		return false, stream.Err()
	}
	var err error
	for {
		var stream *connect.ServerStreamForClient[ctrlv1.WatchWorkspaceResponse]
		stream, err = cl.WatchWorkspace(wctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: ws.GetWorkspaceId()}))
		if err == nil {
			var done bool
			if done, err = follow(stream); done {
				return err
			}
		}
		// The control plane restarts, or its database is away a moment:
		// the Workspace goes on meanwhile, so the wait watches again
		// (its first message is the state now) until the timeout.
		if connect.CodeOf(err) != connect.CodeUnavailable || wctx.Err() != nil {
			break
		}
		select {
		case <-wctx.Done():
		case <-time.After(rewatchDelay):
		}
	}
	last := stateName(r.last.GetState())
	switch {
	case ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("timed out after %s waiting for workspace %s to become %s; it is %s (wait longer with --timeout, or follow it with `ws watch`)",
			timeout, ws.GetWorkspaceId(), stateName(g.state), last)
	case g.state == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED && connect.CodeOf(err) == connect.CodeNotFound:
		return nil // gone altogether
	case err != nil:
		return err
	}
	return fmt.Errorf("the watch ended before workspace %s became %s; it is %s", ws.GetWorkspaceId(), stateName(g.state), last)
}

// rewatchDelay is how long a wait waits before it watches again after its
// watch ended unavailable.
const rewatchDelay = 500 * time.Millisecond

// failureError says why a Workspace is FAILED.
func failureError(ws *ctrlv1.Workspace) error {
	f := ws.GetFailure()
	return errors.New("workspace " + ws.GetWorkspaceId() + " FAILED: " + failureText(f.GetReason(), f.GetStage(), f.GetMessage()))
}

// failureText is a failure as REASON at stage STAGE: message, leaving out
// what is unspecified.
func failureText(reason ctrlv1.FailureReason, stage ctrlv1.FailureStage, message string) string {
	s := enumName(reason, "FAILURE_REASON_")
	if stage != ctrlv1.FailureStage_FAILURE_STAGE_UNSPECIFIED {
		s += " at stage " + enumName(stage, "FAILURE_STAGE_")
	}
	if message != "" {
		s += ": " + message
	}
	return s
}

// reporter shows the progress of a Workspace: each state change as a line,
// and the template delivery in place on a terminal, or as a line per tenth
// delivered elsewhere.
type reporter struct {
	out      *statusLine
	last     *ctrlv1.Workspace
	since    time.Time // when last's state was first seen
	delivery string    // the delivery line last written as a line
}

func (r *reporter) observe(ws *ctrlv1.Workspace) {
	if from, to := r.last.GetState(), ws.GetState(); from != to {
		now := time.Now()
		r.out.println(fmt.Sprintf("%s → %s in %s", stateName(from), stateCell(ws), elapsed(now.Sub(r.since))))
		r.since = now
	}
	r.last = ws
	d := ws.GetDelivery()
	if d == nil || d.GetState() == ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_READY {
		r.out.end()
		return
	}
	text, key := deliveryLine(d)
	r.out.update(text)
	if !r.out.tty && key != r.delivery {
		r.out.println(text)
	}
	r.delivery = key
}

// deliveryLine describes a delivery that is not READY. key changes when the
// line is worth a new line in a log: another reason, message or tenth.
func deliveryLine(d *ctrlv1.TemplateDeliveryObservation) (text, key string) {
	reason := d.GetReason()
	switch {
	case d.GetState() == ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_UNKNOWN:
		text = "template delivery: state unknown"
	case reason != ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_UNSPECIFIED &&
		reason != ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_DISTRIBUTING:
		text = "template delivery: " + enumName(reason, "TEMPLATE_DELIVERY_REASON_")
	case d.GetBytesTotal() > 0:
		text = "delivering template: " + byteProgress(d.GetBytesDelivered(), d.GetBytesTotal())
		return text, fmt.Sprintf("%d%%", percent(d.GetBytesDelivered(), d.GetBytesTotal())/10*10)
	default:
		text = "delivering template"
	}
	if m := d.GetMessage(); m != "" {
		text += ": " + m
	}
	return text, text
}

// elapsed rounds a wait for people: 1.2s, 43s, 2m5s.
func elapsed(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
