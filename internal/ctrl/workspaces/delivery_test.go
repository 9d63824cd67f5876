package workspaces

import (
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
)

// TestDeliveryObservation: the delivery observation of a starting
// workspace says DISTRIBUTING while bytes arrive, READY once the host
// starts the execution and is gone once it is AVAILABLE; a start that
// fails before the template is usable keeps it with the reason (and the
// host's message); a start that fails later drops it; a host that stops
// reporting makes it UNKNOWN, OBSERVATION_STALE, until it reports again.
func TestDeliveryObservation(t *testing.T) {
	s, ctx := newService(t)
	c := &clock{now: time.Now()}
	s.Now = c.get
	if err := s.ExpireLeases(ctx); err != nil { // the ctrl's start: leases count from here
		t.Fatal(err)
	}
	registerLaunch(t, s, ctx, testLaunch("a"))
	type want struct {
		state   ctrlv1.TemplateDeliveryState
		reason  ctrlv1.TemplateDeliveryReason
		message string
	}
	check := func(what string, ws *ctrlv1.Workspace, w *want) {
		t.Helper()
		d := ws.Delivery
		switch {
		case w == nil && d != nil:
			t.Errorf("%s: delivery %v, want none", what, d)
		case w == nil:
		case d == nil:
			t.Errorf("%s: no delivery, want %v %v", what, w.state, w.reason)
		case d.State != w.state || d.Reason != w.reason || d.Message != w.message || d.ObservedAt == nil || d.StartedAt == nil:
			t.Errorf("%s: delivery %v, want %v %v %q", what, d, w.state, w.reason, w.message)
		}
	}
	distributing := func(r *hostv1.ExecutionReport) { r.DeliveryBytesTotal, r.DeliveryBytesDelivered = 100, 40 }
	failing := func(reason ctrlv1.FailureReason, message string) func(*hostv1.ExecutionReport) {
		return func(r *hostv1.ExecutionReport) {
			r.FailureReason, r.FailureStage, r.FailureMessage = reason, ctrlv1.FailureStage_FAILURE_STAGE_CREATING, message
		}
	}

	id := create(t, s, ctx, 256<<20).WorkspaceId
	ws := report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_DELIVERING, distributing)
	check("delivering", ws, &want{ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_NOT_READY, ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_DISTRIBUTING, ""})
	if ws.Delivery.BytesTotal != 100 || ws.Delivery.BytesDelivered != 40 {
		t.Errorf("bytes %d of %d, want 40 of 100", ws.Delivery.BytesDelivered, ws.Delivery.BytesTotal)
	}

	// The host stops reporting; its return makes the observation current.
	c.add(s.Lease())
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	ws, _ = s.Get(ctx, id)
	check("host lost", ws, &want{ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_UNKNOWN, ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_OBSERVATION_STALE, ""})
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_DELIVERING, distributing)
	check("host back", ws, &want{ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_NOT_READY, ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_DISTRIBUTING, ""})

	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_STARTING, nil)
	check("starting", ws, &want{ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_READY, 0, ""})
	if ws.Delivery.BytesDelivered != 100 {
		t.Errorf("ready with %d of %d bytes", ws.Delivery.BytesDelivered, ws.Delivery.BytesTotal)
	}
	// A start that fails after the template was usable has no delivery.
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_FAILED, failing(ctrlv1.FailureReason_FAILURE_REASON_INTERNAL, "runtime refused"))
	check("failed after delivery", ws, nil)

	for _, c := range []struct {
		name    string
		reason  ctrlv1.FailureReason
		deliver bool
		want    ctrlv1.TemplateDeliveryReason
	}{
		{"preparation", ctrlv1.FailureReason_FAILURE_REASON_INTERNAL, true, ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_PREPARATION_FAILED},
		{"no path", ctrlv1.FailureReason_FAILURE_REASON_UNSUPPORTED, true, ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_NO_SUPPORTED_PATH},
		// The host refuses the launch before it delivers anything.
		{"capability", ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false, ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_CAPABILITY_MISMATCH},
	} {
		if ws, err := Start(ctx, s, write("start", newWS), id, identity); err != nil || ws.Delivery != nil {
			t.Fatalf("%s: start: %v, delivery %v", c.name, err, ws.GetDelivery())
		}
		if c.deliver {
			report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_DELIVERING, distributing)
		}
		ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_FAILED, failing(c.reason, c.name+" failed"))
		if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED {
			t.Fatalf("%s: %v, want FAILED", c.name, ws.State)
		}
		check(c.name, ws, &want{ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_NOT_READY, c.want, c.name + " failed"})
	}

	// Available: no delivery.
	if _, err := Start(ctx, s, write("start", newWS), id, identity); err != nil {
		t.Fatal(err)
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_DELIVERING, distributing)
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	if ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("%v, want AVAILABLE", ws.State)
	}
	check("available", ws, nil)
}
