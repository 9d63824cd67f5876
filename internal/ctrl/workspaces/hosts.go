package workspaces

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
)

// This file is the host-facing half: registrations, each host's desired
// executions, and folding host reports into workspaces.

func decodeHost(h store.Host) (*hostv1.RegisterHostRequest, error) {
	reg := new(hostv1.RegisterHostRequest)
	if err := proto.Unmarshal(h.Body, reg); err != nil {
		return nil, fmt.Errorf("host %s: %w", h.ID, err)
	}
	return reg, nil
}

// RegisterHost stores a host's registration and capacity.
func (s *Service) RegisterHost(ctx context.Context, reg *hostv1.RegisterHostRequest) error {
	if reg.HostId == "" {
		return invalid("host_id is required")
	}
	body, err := proto.Marshal(reg)
	if err != nil {
		return err
	}
	c := reg.GetCapacity()
	return s.Store.Update(ctx, func(tx store.Tx) error {
		return tx.PutHost(ctx, store.Host{ID: reg.HostId, Body: body, CPUMillis: c.GetCpuMillis(),
			MemoryBytes: c.GetMemoryBytes(), LayerBytes: c.GetLayerBytes(), SeenAt: s.now()})
	})
}

// DataPlaneEndpoint returns the data-plane endpoint a host registered;
// empty when it registered none, or when no host has the ID.
func DataPlaneEndpoint(ctx context.Context, tx store.Tx, hostID string) (string, error) {
	hosts, err := tx.Hosts(ctx)
	if err != nil {
		return "", err
	}
	for _, h := range hosts {
		if h.ID != hostID {
			continue
		}
		reg, err := decodeHost(h)
		if err != nil {
			return "", err
		}
		return reg.DataPlaneEndpoint, nil
	}
	return "", nil
}

// executionID names the execution that serves one start of a workspace:
// its generation, and the attempt when a failed start was retried.
func executionID(workspaceID string, generation, attempt uint64) string {
	if attempt == 0 {
		return fmt.Sprintf("%s-%d", workspaceID, generation)
	}
	return fmt.Sprintf("%s-%d-%d", workspaceID, generation, attempt)
}

// Assignments returns the complete desired set of a host.
func (s *Service) Assignments(ctx context.Context, hostID string) (*hostv1.WatchAssignmentsResponse, error) {
	out := new(hostv1.WatchAssignmentsResponse)
	now := s.now()
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		if out.Volumes, err = volumes.HostAssignments(ctx, tx, hostID); err != nil {
			return err
		}
		rows, err := tx.HostWorkspaces(ctx, hostID)
		if err != nil {
			return err
		}
		for _, row := range rows {
			r, err := decode(row)
			if err != nil {
				return err
			}
			a := r.assignment(now)
			if a.Desired == hostv1.DesiredState_DESIRED_STATE_RUNNING {
				if a.Network, err = networkAssignment(ctx, tx, r); err != nil {
					return err
				}
			}
			if a.Volume, err = executionVolume(ctx, tx, r); err != nil {
				return err
			}
			out.Assignments = append(out.Assignments, a)
		}
		return nil
	})
	return out, err
}

func (r *record) assignment(now time.Time) *hostv1.Assignment {
	res := proto.CloneOf(r.ws.GetSpec().GetResources())
	res.WritableLayerBytes = r.row.LayerBytes
	a := &hostv1.Assignment{
		ExecutionId: executionID(r.row.ID, r.book.Target, r.book.Attempt),
		WorkspaceId: r.row.ID,
		Generation:  r.book.Target,
		Resources:   res,
		LayerId:     r.row.ID,
		Template: &hostv1.ExecutionTemplate{
			TemplateId: r.book.Image.TemplateID, Revision: r.book.Image.Revision,
			ImageDigest: r.book.Image.Digest, Env: r.book.Image.Env,
		},
	}
	for _, l := range r.book.Image.Layers {
		a.Template.Layers = append(a.Template.Layers, &hostv1.TemplateLayer{Digest: l.Digest, DiffId: l.DiffID, SizeBytes: uint64(l.Size)})
	}
	switch r.book.Desired {
	case DesiredRunning:
		a.Desired = hostv1.DesiredState_DESIRED_STATE_RUNNING
		if dp := &r.book.DataPlane; len(dp.Key) > 0 {
			a.DataPlane = &hostv1.DataPlane{Key: dp.Key, RevokedSessionIds: dp.revokedIDs(now)}
		}
	case DesiredStopped:
		a.Desired = hostv1.DesiredState_DESIRED_STATE_STOPPED
	case DesiredDeleted:
		a.Desired = hostv1.DesiredState_DESIRED_STATE_DELETED
	}
	if r.book.Desired != DesiredRunning {
		mode := r.book.StopMode
		if r.book.Desired == DesiredDeleted {
			mode = ctrlv1.StopMode_STOP_MODE_FORCE // deletion keeps nothing to sync
		}
		a.Stop = &hostv1.StopRequest{Mode: mode, CommandId: r.book.StopCommand}
	}
	return a
}

// Report folds a host's execution reports into the workspaces they serve,
// and its volume reports into the Volumes it holds. Reports of workspaces
// not placed on the host, or of executions that no longer serve their
// workspace, are ignored.
func (s *Service) Report(ctx context.Context, hostID string, reports []*hostv1.ExecutionReport, volumeReports []*hostv1.VolumeReport) error {
	var changed []string
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		var err error
		if changed, err = s.Volumes.Report(ctx, tx, hostID, volumeReports); err != nil {
			return err
		}
		rows, err := tx.HostWorkspaces(ctx, hostID)
		if err != nil {
			return err
		}
		byID := map[string]store.Workspace{}
		for _, row := range rows {
			byID[row.ID] = row
		}
		for _, rep := range reports {
			row, ok := byID[rep.WorkspaceId]
			if !ok {
				continue
			}
			r, err := decode(row)
			if err != nil {
				return err
			}
			if rep.ExecutionId != executionID(row.ID, r.book.Target, r.book.Attempt) {
				continue
			}
			before := proto.CloneOf(r.ws)
			beforeRow := r.row
			if err := s.apply(ctx, tx, r, rep); err != nil {
				return err
			}
			if proto.Equal(before, r.ws) && beforeRow.DeletedAt.Equal(r.row.DeletedAt) && beforeRow.Running == (r.book.Desired == DesiredRunning) {
				continue
			}
			if err := s.save(ctx, tx, r); err != nil {
				return err
			}
			byID[row.ID] = r.row
			changed = append(changed, row.ID)
		}
		return nil
	})
	for _, id := range changed {
		s.Changes.Publish(id)
	}
	return err
}

// apply moves a workspace by what its execution reports.
func (s *Service) apply(ctx context.Context, tx store.Tx, r *record, rep *hostv1.ExecutionReport) error {
	now := s.now()
	state := r.ws.State
	starting := state == ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING || state == ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
	switch rep.State {
	case hostv1.ObservedState_OBSERVED_STATE_DELIVERING:
		if starting {
			d := r.ws.Delivery
			if d == nil {
				d = &ctrlv1.TemplateDeliveryObservation{StartedAt: timestamppb.New(now)}
			}
			d.State = ctrlv1.TemplateDeliveryState_TEMPLATE_DELIVERY_STATE_NOT_READY
			d.Reason = ctrlv1.TemplateDeliveryReason_TEMPLATE_DELIVERY_REASON_DISTRIBUTING
			d.BytesTotal, d.BytesDelivered = rep.DeliveryBytesTotal, rep.DeliveryBytesDelivered
			d.ObservedAt = timestamppb.New(now)
			r.ws.Delivery = d
		}
	case hostv1.ObservedState_OBSERVED_STATE_STARTING:
		if starting {
			r.ws.Delivery = nil
		}
	case hostv1.ObservedState_OBSERVED_STATE_RUNNING:
		if r.book.Desired == DesiredRunning {
			applyNetwork(r.ws, rep.Network, now)
		}
		if r.book.Desired != DesiredRunning || !(starting || state == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN) {
			return nil
		}
		first := r.book.Target == 1
		cont := &continuity{kind: ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_CONTINUED}
		switch {
		case first:
			cont = &continuity{kind: ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET, reason: ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_FIRST_START}
		case !rep.LayerContinued:
			cont = &continuity{kind: ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET, reason: ctrlv1.RetentionResetReason_RETENTION_RESET_REASON_LAYER_UNAVAILABLE}
		}
		if r.ws.Generation != r.book.Target {
			// Tokens of earlier generations fail by their generation.
			r.book.DataPlane.Revoked = nil
		}
		if len(r.book.DataPlane.Key) == 0 {
			r.book.DataPlane.Key = NewDataPlaneKey()
		}
		r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
		r.ws.Generation = r.book.Target
		r.ws.Delivery, r.ws.Failure = nil, nil
		r.ws.RetentionTiers = retentionTiers(cont, rep.GetLayerCapacityBytes(), rep.LayerCapacityBytes != nil)
		r.ws.Reestablish = nil
		if !first {
			r.ws.Reestablish = []ctrlv1.ReestablishRequirement{
				ctrlv1.ReestablishRequirement_REESTABLISH_REQUIREMENT_DATA_PLANE_SESSION,
				ctrlv1.ReestablishRequirement_REESTABLISH_REQUIREMENT_PROCESS,
			}
		}
	case hostv1.ObservedState_OBSERVED_STATE_STOPPED:
		if r.book.Desired == DesiredStopped && state == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING {
			r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
			if r.ws.LastStop != nil {
				r.ws.LastStop.Durability = rep.StopDurability
				r.ws.LastStop.CompletedAt = timestamppb.New(now)
			}
			s.layerKept(r, rep)
		}
	case hostv1.ObservedState_OBSERVED_STATE_EXITED:
		if r.book.Desired == DesiredRunning && state == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			// The guest ended on its own: release the execution as a
			// forced stop so that the caller can start it again.
			s.beginStop(r, ctrlv1.StopCause_STOP_CAUSE_GUEST_SHUTDOWN, ctrlv1.StopMode_STOP_MODE_FORCE, "")
		}
	case hostv1.ObservedState_OBSERVED_STATE_DELETED:
		if r.book.Desired == DesiredDeleted {
			return s.finishDelete(ctx, tx, r)
		}
	case hostv1.ObservedState_OBSERVED_STATE_FAILED:
		if r.book.Desired == DesiredDeleted {
			return nil // the host retries the deletion; DELETING stays
		}
		stage := rep.FailureStage
		if stage == ctrlv1.FailureStage_FAILURE_STAGE_UNSPECIFIED {
			stage = ctrlv1.FailureStage_FAILURE_STAGE_STARTING
		}
		reason := rep.FailureReason
		if reason == ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
			reason = ctrlv1.FailureReason_FAILURE_REASON_INTERNAL
		}
		if lost, err := volumeLost(ctx, tx, r); err != nil {
			return err
		} else if lost {
			// A start already under way when the pool was declared lost.
			reason = ctrlv1.FailureReason_FAILURE_REASON_VOLUME_LOST
		}
		r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
		r.ws.Failure = &ctrlv1.WorkspaceFailure{Reason: reason, Stage: stage, Message: rep.FailureMessage, FailedAt: timestamppb.New(now)}
		r.ws.Delivery = nil
		r.book.Desired = DesiredStopped
	}
	switch r.ws.State {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING:
	default:
		clearNetwork(r.ws) // no current execution
	}
	return nil
}

// layerKept records the layer's capacity in the BEST_EFFORT tier after a
// stop.
func (s *Service) layerKept(r *record, rep *hostv1.ExecutionReport) {
	if rep.LayerCapacityBytes == nil {
		return
	}
	for _, t := range r.ws.RetentionTiers {
		if t.Kind == ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT {
			t.CapacityBytes = rep.LayerCapacityBytes
		}
	}
}

// Expire applies the expiration policies whose deadline has passed:
// STOP stops a running workspace normally, DELETE deletes it; the cause is
// EXPIRED either way.
func (s *Service) Expire(ctx context.Context) error {
	var changed []string
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		changed = changed[:0]
		rows, err := tx.ExpiredWorkspaces(ctx, s.now(), 100)
		if err != nil {
			return err
		}
		for _, row := range rows {
			r, err := decode(row)
			if err != nil {
				return err
			}
			r.row.ExpiresAt = time.Time{} // fired: never again for this policy
			switch r.ws.GetExpiration().GetPolicy().GetAction() {
			case ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE:
				if err := s.beginDelete(ctx, tx, r, ctrlv1.StopCause_STOP_CAUSE_EXPIRED); err != nil {
					return err
				}
			default:
				switch r.ws.State {
				case ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING,
					ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE:
					s.beginStop(r, ctrlv1.StopCause_STOP_CAUSE_EXPIRED, ctrlv1.StopMode_STOP_MODE_NORMAL, "")
				}
			}
			if err := s.save(ctx, tx, r); err != nil {
				return err
			}
			changed = append(changed, row.ID)
		}
		return nil
	})
	for _, id := range changed {
		s.Changes.Publish(id)
	}
	return err
}

// Watch calls send with the workspace now and after every change, until
// ctx ends, send fails, or the workspace is DELETED. poll bounds how long
// a change made by another ctrl replica can go unseen.
func (s *Service) Watch(ctx context.Context, id string, poll time.Duration, send func(*ctrlv1.Workspace) error) error {
	var last *ctrlv1.Workspace
	for {
		changed := s.Changes.Changed()
		ws, err := s.Get(ctx, id)
		if err != nil {
			return err
		}
		if last == nil || !proto.Equal(last, ws) {
			if err := send(ws); err != nil {
				return err
			}
			last = ws
		}
		if ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-time.After(poll):
		}
	}
}
