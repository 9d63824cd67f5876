package agent

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"connectrpc.com/connect"
)

// A host agent serves its workspaces' data plane (and exposures) only
// while the control plane holds it to be theirs. It serves nothing
// (outOfService) while ctrl refuses it (its host token revoked, its name
// another token's, or taken by another agent since), and while it is
// fenced: once a lease has passed without ctrl taking a registration or
// report of this agent, ctrl may hold the host LOST and release its
// workspaces to run elsewhere, and a call served here would reach an
// execution that is no longer theirs (a write acknowledged, then deleted
// with its layer). The fence lifts once a registration is taken again and
// the assignments that came with it are applied. An agent starts fenced.

// fenceBefore is how long before the end of the lease the agent fences
// itself: ctrl counts the lease from when it took a call, no earlier than
// when the agent sent it, but the two processes measure time apart.
func fenceBefore(lease time.Duration) time.Duration { return lease / 10 }

// heard records that ctrl took a registration or report this agent sent
// at sent: the fence waits a lease from then.
func (a *Agent) heard(sent time.Time) {
	lease := time.Duration(a.lease.Load())
	if lease <= 0 {
		return
	}
	a.contact.Store(&sent)
	a.fenceTimer.Reset(time.Until(sent.Add(lease - fenceBefore(lease))))
}

// fence takes the host out of service, and ends the assignment stream,
// so that the fence lifts only with a new registration and the
// assignments that come with it.
func (a *Agent) fence() {
	if !a.fenced.Swap(true) {
		slog.Error("the control plane took no registration or report of this host within its lease: it may hold the host LOST and run its workspaces elsewhere, so the host serves no data-plane call until it registers again",
			"lease", time.Duration(a.lease.Load()))
	}
	if cut := a.cutWatch.Load(); cut != nil {
		(*cut)()
	}
}

// unfence lifts the fence once the assignments of a registration are
// applied, if ctrl took that registration within the lease (a ctrl that
// names no lease fences nothing).
func (a *Agent) unfence() {
	if a.leaseLapsed() {
		return
	}
	if a.fenced.Swap(false) {
		slog.Info("the host serves the data plane: the control plane took its registration")
		a.servingOnce.Do(func() { close(a.serving) })
	}
}

// outOfService says why the host serves no data-plane call or exposure
// now; empty while it serves them. The lease is checked here too, not
// only by the timer that fences: a process that was frozen past its lease
// may run a waiting call before the timer's goroutine.
func (a *Agent) outOfService() string {
	if r := a.refusal.Load(); r != nil {
		return "the control plane refuses this agent (" + *r + ")"
	}
	if a.fenced.Load() || a.leaseLapsed() {
		select {
		case <-a.serving:
		default:
			// Fenced since it started: no lease of its has lapsed, and its
			// workspaces may still run here.
			return "it has not registered with the control plane since it started"
		}
		return "it has not reached the control plane within its lease, so its workspaces may run elsewhere now"
	}
	return ""
}

// leaseLapsed reports whether the lease (less fenceBefore) has passed
// since the last registration or report ctrl took.
func (a *Agent) leaseLapsed() bool {
	lease, contact := time.Duration(a.lease.Load()), a.contact.Load()
	return lease > 0 && (contact == nil || time.Since(*contact) >= lease-fenceBefore(lease))
}

// OutOfService says why the host serves no data-plane call or exposure
// now, for its readiness: ctrl refuses it, or it is fenced. Empty while
// it serves them.
func (a *Agent) OutOfService() string { return a.outOfService() }

// watchContext returns the context of one assignment stream, which fence
// cancels.
func (a *Agent) watchContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	a.cutWatch.Store(&cancel)
	return ctx, cancel
}

// refusalMessage is ctrl's message of the refusal err.
func refusalMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}
