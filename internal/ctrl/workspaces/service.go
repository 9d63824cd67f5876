package workspaces

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/scheduler"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// Service implements the workspace methods over a store.
type Service struct {
	Store   store.Store
	Pages   *pagetoken.Codec
	Checker *netcheck.Checker
	// Volumes keeps the Volumes workspaces bind.
	Volumes *volumes.Service
	// Changes is told about every committed change of a workspace, so that
	// watchers and host streams wake up.
	Changes *Broker
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// Write describes a write request.
type Write[R proto.Message] = resource.Mutation[R]

func caller(ctx context.Context) auth.Caller {
	c, _ := auth.CallerFrom(ctx)
	return c
}

// mutate runs one command that changes one workspace: load it, let change
// edit the record, store it, and answer with the workspace.
func mutate[R proto.Message](ctx context.Context, s *Service, w Write[R], id string,
	change func(ctx context.Context, tx store.Tx, r *record) error, respond func(*ctrlv1.Workspace) R) (R, error) {
	if id == "" {
		var zero R
		return zero, invalid("workspace_id is required")
	}
	resp, changed, err := resource.Edit(ctx, s.Store, w,
		func(ctx context.Context, tx store.Tx, projectID string) (*record, error) {
			return s.load(ctx, tx, projectID, id)
		},
		(*record).encode, change, s.save, present, respond)
	if changed {
		s.Changes.Publish(id)
	}
	return resp, err
}

// load reads a live workspace of the project; deleted and other projects'
// workspaces are not_found.
func (s *Service) load(ctx context.Context, tx store.Tx, projectID, id string) (*record, error) {
	row, err := tx.Workspace(ctx, projectID, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("workspace %q not found", id))
	}
	if err != nil {
		return nil, err
	}
	return decode(row)
}

// save stores a record, stamping updated_at.
func (s *Service) save(ctx context.Context, tx store.Tx, r *record) error {
	now := s.now()
	r.ws.UpdatedAt = timestamppb.New(now)
	r.row.UpdatedAt = now
	row, err := r.encode()
	if err != nil {
		return err
	}
	if err := tx.UpdateWorkspace(ctx, row); err != nil {
		return err
	}
	r.row = row // so that a later change in the same transaction builds on this one
	return s.syncVolume(ctx, tx, r)
}

// precondition is failed_precondition with the workspace's durable state
// attached, as the reference asks.
func precondition(ws *ctrlv1.Workspace, format string, a ...any) error {
	if ws == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, a...))
	}
	return preconditionWith(&ctrlv1.ErrorDetail{ObservedWorkspace: ws}, format, a...)
}

// preconditionWith is failed_precondition carrying detail.
func preconditionWith(detail *ctrlv1.ErrorDetail, format string, a ...any) error {
	err := connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, a...))
	if d, derr := connect.NewErrorDetail(detail); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// InUse is the failed_precondition of a change that a workspace of the
// caller's project stands in the way of, with that workspace attached as
// ErrorDetail.observed_workspace (when it can be read).
func InUse(ctx context.Context, tx store.Tx, projectID, workspaceID, format string, a ...any) error {
	var ws *ctrlv1.Workspace
	if row, err := tx.Workspace(ctx, projectID, workspaceID); err == nil {
		if r, err := decode(row); err == nil {
			ws = observed(ctx, tx, r)
		}
	}
	return precondition(ws, format, a...)
}

// Create validates, resolves the template, places the workspace on a host
// and stores it in CREATING, all in one command.
func Create[R proto.Message](ctx context.Context, s *Service, w Write[R], spec *ctrlv1.WorkspaceCreateSpec,
	labels, annotations map[string]string, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	cmd, err := resource.CommandOf(ctx, w)
	if err != nil {
		return zero, err
	}
	if spec == nil {
		return zero, invalid("spec is required")
	}
	resources, err := checkResources(spec.Resources)
	if err != nil {
		return zero, err
	}
	if err := checkCapabilities(spec.Capabilities); err != nil {
		return zero, err
	}
	volume, err := checkVolume(spec.Volume, true)
	if err != nil {
		return zero, err
	}
	if err := resource.CheckMaps(labels, annotations); err != nil {
		return zero, err
	}
	// A retry replays before the slow checks, which DNS could now answer
	// differently.
	if resp, found, err := command.Replay(ctx, s.Store, cmd); err != nil || found {
		return resp, err
	}
	if err := checkExpiration(spec.Expiration, s.now()); err != nil {
		return zero, err
	}
	if err := checkDirectUpstreams(ctx, s.Store, s.Checker, cmd.ProjectID, spec.NetworkPolicy); err != nil {
		return zero, err
	}
	var id string
	resp, err := command.Run(ctx, s.Store, cmd, func(ctx context.Context, tx store.Tx) (R, error) {
		ref, image, err := templates.Resolve(ctx, tx, cmd.ProjectID, spec.Template)
		if err != nil {
			return zero, err
		}
		policy, refs, err := checkPolicy(ctx, tx, cmd.ProjectID, spec.NetworkPolicy)
		if err != nil {
			return zero, err
		}
		policy.Revision = 1
		need := placement{capabilities: spec.Capabilities.GetRequired()}
		var bound *volumes.Record
		switch volume.Mode {
		case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND:
			if bound, err = s.Volumes.Bindable(ctx, tx, cmd.ProjectID, volume.VolumeId, ""); err != nil {
				return zero, err
			}
			need.pool, need.host = bound.Pool(), bound.Holder()
		case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW:
			need.pool = s.Volumes.DefaultPool
		}
		host, layerBytes, err := s.place(ctx, tx, resources, need)
		if err != nil {
			return zero, err
		}
		now := s.now()
		id = ids.New("ws")
		switch volume.Mode {
		case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND:
			err = s.Volumes.Bind(ctx, tx, bound, id, true)
		case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW:
			bound, err = s.Volumes.CreateForWorkspace(ctx, tx, cmd.ProjectID, host, id)
			if err == nil {
				volume.Mode, volume.VolumeId = ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, bound.V.VolumeId
			}
		}
		if err != nil {
			return zero, err
		}
		ws := &ctrlv1.Workspace{
			WorkspaceId: id,
			Spec: &ctrlv1.WorkspaceSpec{
				Template: ref, Resources: resources, Capabilities: spec.Capabilities, Volume: volume,
				NetworkPolicy: policy, ResourcesRevision: 1, LaunchBindingVersion: 1, BindingRevision: 1,
			},
			State:               ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING,
			CreatedAt:           timestamppb.New(now),
			UpdatedAt:           timestamppb.New(now),
			Labels:              labels,
			Annotations:         annotations,
			LabelsRevision:      1,
			AnnotationsRevision: 1,
			RetentionTiers:      retentionTiers(nil, 0, false),
		}
		if spec.Expiration != nil {
			ws.Expiration = &ctrlv1.WorkspaceExpiration{Policy: spec.Expiration, Revision: 1}
		}
		r := &record{ws: ws, book: bookkeeping{Desired: DesiredRunning, Target: 1, Image: image}}
		r.row = store.Workspace{ProjectID: cmd.ProjectID, ID: id, TemplateID: ref.TemplateId, HostID: host,
			CPUMillis: resources.CpuMillis, MemoryBytes: resources.MemoryBytes, LayerBytes: layerBytes,
			CreatedAt: now, UpdatedAt: now}
		if spec.Expiration != nil {
			r.row.ExpiresAt = spec.Expiration.Deadline.AsTime()
		}
		row, err := r.encode()
		if err != nil {
			return zero, err
		}
		if err := tx.CreateWorkspace(ctx, row); err != nil {
			return zero, err
		}
		if err := tx.SetPolicyReferences(ctx, cmd.ProjectID, id, refs); err != nil {
			return zero, err
		}
		view, err := present(ctx, tx, r)
		if err != nil {
			return zero, err
		}
		return respond(view), nil
	})
	if err == nil {
		s.Changes.Publish(id)
	}
	return resp, err
}

// placement is what a workspace needs of its host beyond capacity.
type placement struct {
	// host is the only host it may run on (the holder of its Volume);
	// empty for any.
	host string
	// pool is the storage pool the host must reach; empty for none.
	pool string
	// capabilities are the capabilities the host must offer.
	capabilities []string
}

// place picks a host with room for the workspace that meets need, and
// returns it with the writable layer's capacity (the host's default when
// none was asked for).
func (s *Service) place(ctx context.Context, tx store.Tx, res *ctrlv1.ResourceRequest, need placement) (string, uint64, error) {
	all, err := s.hosts(ctx, tx, "")
	if err != nil {
		return "", 0, err
	}
	offered := map[string]bool{} // by any host
	for _, h := range all {
		maps.Copy(offered, h.offers)
	}
	want := slices.Clone(need.capabilities)
	for _, c := range want {
		if !offered[c] {
			return "", 0, capabilityUnavailable(c)
		}
	}
	if need.pool != "" {
		want = append(want, "pool:"+need.pool)
	}
	var hosts []scheduler.Host
	for _, h := range all {
		if (need.host == "" || h.ID == need.host) && !slices.ContainsFunc(want, func(c string) bool { return !h.offers[c] }) {
			hosts = append(hosts, h.Host)
		}
	}
	if need.pool != "" && len(hosts) == 0 {
		return "", 0, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("no host that holds volumes of storage pool %q has the capabilities this workspace requires", need.pool))
	}
	id, layer, err := scheduler.Place(hosts, scheduler.Request{
		CPUMillis: res.CpuMillis, MemoryBytes: res.MemoryBytes, LayerBytes: res.WritableLayerBytes})
	if err != nil {
		return "", 0, exhausted(err)
	}
	return id, layer, nil
}

// fitsOnItsHost checks that a stopped workspace's CPU and memory fit on
// the host that keeps its layer (the layer's bytes stay reserved there).
func (s *Service) fitsOnItsHost(ctx context.Context, tx store.Tx, r *record) error {
	return s.fitsMore(ctx, tx, r, scheduler.Request{CPUMillis: r.row.CPUMillis, MemoryBytes: r.row.MemoryBytes})
}

// fitsMore checks that the workspace's host has room for req beyond what
// it already holds there.
func (s *Service) fitsMore(ctx context.Context, tx store.Tx, r *record, req scheduler.Request) error {
	all, err := s.hosts(ctx, tx, r.row.HostID)
	if err != nil {
		return err
	}
	var hosts []scheduler.Host
	for _, h := range all {
		h.DefaultLayerBytes = 0
		hosts = append(hosts, h.Host)
	}
	if _, _, err := scheduler.Place(hosts, req); err != nil {
		return exhausted(err)
	}
	return nil
}

// exhausted is resource_exhausted without the scheduler's detail, which
// names hosts: callers learn nothing of the deployment's layout.
func exhausted(err error) error {
	slog.Info("placement refused", "err", err)
	return connect.NewError(connect.CodeResourceExhausted,
		errors.New("no host has the CPU, memory and disk this workspace needs free; retry later or ask for less"))
}

// hosts returns the registered hosts (or only the one named) with what
// is reserved on each (layer bytes of every placed workspace, CPU and
// memory of the running ones) and what each offers.
func (s *Service) hosts(ctx context.Context, tx store.Tx, only string) ([]candidate, error) {
	all, err := tx.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	var out []candidate
	for _, h := range all {
		if only != "" && h.ID != only {
			continue
		}
		reg, err := decodeHost(h)
		if err != nil {
			return nil, err
		}
		placed, err := tx.HostWorkspaces(ctx, h.ID)
		if err != nil {
			return nil, err
		}
		host := scheduler.Host{ID: h.ID, Capacity: scheduler.Resources{CPUMillis: h.CPUMillis, MemoryBytes: h.MemoryBytes, LayerBytes: h.LayerBytes},
			DefaultLayerBytes: reg.GetCapacity().GetDefaultLayerBytes()}
		for _, w := range placed {
			host.Reserved.LayerBytes += w.LayerBytes
			if w.Running {
				host.Reserved.CPUMillis += w.CPUMillis
				host.Reserved.MemoryBytes += w.MemoryBytes
			}
		}
		offers := map[string]bool{}
		for _, c := range reg.Capabilities {
			offers[c] = true
		}
		for _, p := range reg.StoragePools {
			offers["pool:"+p.Name] = true
		}
		out = append(out, candidate{Host: host, offers: offers})
	}
	return out, nil
}

// candidate is a registered host as placement sees it.
type candidate struct {
	scheduler.Host
	// offers holds its capabilities and, as "pool:NAME", its storage pools.
	offers map[string]bool
}

// Get returns a workspace.
func (s *Service) Get(ctx context.Context, id string) (*ctrlv1.Workspace, error) {
	if id == "" {
		return nil, invalid("workspace_id is required")
	}
	var ws *ctrlv1.Workspace
	err := s.Store.View(ctx, func(tx store.Tx) error {
		r, err := s.load(ctx, tx, caller(ctx).ProjectID, id)
		if err == nil {
			ws, err = present(ctx, tx, r)
		}
		return err
	})
	return ws, err
}

// List returns one page of live workspaces.
func (s *Service) List(ctx context.Context, pageSize uint32, token string, selector map[string]string) ([]*ctrlv1.Workspace, string, error) {
	return resource.ListPage(ctx, s.Store, s.Pages, "workspace", pageSize, token, selector,
		func(ctx context.Context, tx store.Tx, q store.ObjectQuery) ([]store.Workspace, error) {
			return tx.Workspaces(ctx, q)
		},
		func(w store.Workspace) string { return w.ID },
		func(ctx context.Context, tx store.Tx, row store.Workspace) (*ctrlv1.Workspace, error) {
			r, err := decode(row)
			if err != nil {
				return nil, err
			}
			return present(ctx, tx, r)
		})
}

// Start starts a STOPPED (or FAILED) workspace.
func Start[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, respond func(*ctrlv1.Workspace) R) (R, error) {
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		switch r.ws.State {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
		default:
			return precondition(observed(ctx, tx, r), "workspace %s is %s; only a STOPPED or FAILED workspace can be started", id, StateName(r.ws.State))
		}
		if err := s.volumeStartable(ctx, tx, r); err != nil {
			return err
		}
		if err := s.fitsOnItsHost(ctx, tx, r); err != nil {
			return err
		}
		r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
		r.ws.LastStop, r.ws.Failure = nil, nil
		r.book.Desired = DesiredRunning
		if r.book.Target == r.ws.Generation+1 {
			r.book.Attempt++ // a retry of a start that failed
		} else {
			r.book.Target, r.book.Attempt = r.ws.Generation+1, 0
		}
		r.book.StopMode, r.book.StopCommand, r.book.StopCause = 0, "", 0
		return nil
	}, respond)
}

// Stop stops a workspace that runs or is starting; FORCE also cuts short a
// NORMAL stop in progress.
func Stop[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, mode ctrlv1.StopMode, respond func(*ctrlv1.Workspace) R) (R, error) {
	switch mode {
	case ctrlv1.StopMode_STOP_MODE_UNSPECIFIED:
		mode = ctrlv1.StopMode_STOP_MODE_NORMAL
	case ctrlv1.StopMode_STOP_MODE_NORMAL, ctrlv1.StopMode_STOP_MODE_FORCE:
	default:
		var zero R
		return zero, invalid("mode %d is not a known stop mode", mode)
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		switch r.ws.State {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING,
			ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN:
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING:
			if mode != ctrlv1.StopMode_STOP_MODE_FORCE || r.book.StopMode == ctrlv1.StopMode_STOP_MODE_FORCE {
				return precondition(observed(ctx, tx, r), "workspace %s is already STOPPING; only a FORCE stop can cut a NORMAL stop short", id)
			}
		default:
			return precondition(observed(ctx, tx, r), "workspace %s is %s; it is not running", id, StateName(r.ws.State))
		}
		s.beginStop(r, ctrlv1.StopCause_STOP_CAUSE_REQUESTED, mode, w.Command.GetCommandId())
		return nil
	}, respond)
}

// beginStop moves a record to STOPPING with the stop it names.
func (s *Service) beginStop(r *record, cause ctrlv1.StopCause, mode ctrlv1.StopMode, commandID string) {
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
	r.ws.LastStop = &ctrlv1.WorkspaceStop{Cause: cause, Mode: mode, CommandId: commandID, RequestedAt: timestamppb.New(s.now())}
	r.ws.Delivery = nil
	r.book.Desired = DesiredStopped
	r.book.StopMode, r.book.StopCommand, r.book.StopCause = mode, commandID, cause
}

// Delete deletes a workspace: its host stops the execution and removes the
// writable layer, then it is DELETED.
func Delete[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, respond func(*ctrlv1.Workspace) R) (R, error) {
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		switch r.ws.State {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
			return nil // already going: returned unchanged
		}
		return s.beginDelete(ctx, tx, r, ctrlv1.StopCause_STOP_CAUSE_REQUESTED)
	}, respond)
}

// beginDelete moves a record to DELETING; a workspace on no host is
// DELETED at once.
func (s *Service) beginDelete(ctx context.Context, tx store.Tx, r *record, cause ctrlv1.StopCause) error {
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING
	r.ws.LastStop = nil
	r.ws.Delivery = nil
	r.book.Desired = DesiredDeleted
	r.book.StopCause = cause
	if r.row.HostID == "" {
		return s.finishDelete(ctx, tx, r)
	}
	return nil
}

// finishDelete marks a record DELETED, releasing its host reservation and
// its policy references.
func (s *Service) finishDelete(ctx context.Context, tx store.Tx, r *record) error {
	now := s.now()
	r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
	r.ws.Delivery, r.ws.GuestObservation, r.ws.NetworkPolicyStatus = nil, nil, nil
	r.row.DeletedAt = now
	r.row.HostID = ""
	if err := s.releaseVolume(ctx, tx, r, r.ws.Spec.GetVolume().GetDeleteWithWorkspace()); err != nil {
		return err
	}
	return tx.SetPolicyReferences(ctx, r.row.ProjectID, r.row.ID, nil)
}

// UpdateMap replaces the labels or the annotations (field) under CAS on
// their revision.
func UpdateMap[R proto.Message](ctx context.Context, s *Service, w Write[R], field resource.MapField, id string, expected uint64,
	m map[string]string, respond func(*ctrlv1.Workspace) R) (R, error) {
	if err := field.CheckMapWrite(m, expected); err != nil {
		var zero R
		return zero, err
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		if err := live(ctx, tx, r); err != nil {
			return err
		}
		current, revision := field.Select(&r.ws.Labels, &r.ws.LabelsRevision, &r.ws.Annotations, &r.ws.AnnotationsRevision)
		return field.Replace(current, revision, expected, m)
	}, respond)
}

// UpdateExpiration sets or clears the expiration policy.
func UpdateExpiration[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, change *ctrlv1.WorkspaceExpirationChange, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	var policy *ctrlv1.WorkspaceExpirationPolicy
	switch c := change.GetChange().(type) {
	case *ctrlv1.WorkspaceExpirationChange_Set:
		if c.Set == nil {
			return zero, invalid("change.set is required")
		}
		policy = c.Set
	case *ctrlv1.WorkspaceExpirationChange_Clear:
	default:
		return zero, invalid("change must set or clear the expiration")
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		if err := live(ctx, tx, r); err != nil {
			return err
		}
		// Checked here, after the replay lookup: a retry replays even
		// once the deadline has passed.
		if err := checkExpiration(policy, s.now()); err != nil {
			return err
		}
		rev := max(r.ws.GetExpiration().GetRevision(), r.book.ExpirationRevision)
		if proto.Equal(r.ws.GetExpiration().GetPolicy(), policy) {
			return nil
		}
		r.book.ExpirationRevision = rev
		if policy == nil {
			r.ws.Expiration = nil
			r.row.ExpiresAt = time.Time{}
			return nil
		}
		r.ws.Expiration = &ctrlv1.WorkspaceExpiration{Policy: policy, Revision: rev + 1}
		r.row.ExpiresAt = policy.Deadline.AsTime()
		return nil
	}, respond)
}

// live refuses changes to a workspace that is going away.
func live(ctx context.Context, tx store.Tx, r *record) error {
	if r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING || r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return precondition(observed(ctx, tx, r), "workspace %s is %s", r.ws.WorkspaceId, StateName(r.ws.State))
	}
	return nil
}

// StateName is a state without its enum prefix, for messages.
func StateName(s ctrlv1.WorkspaceState) string {
	name := s.String()
	const prefix = "WORKSPACE_STATE_"
	if len(name) > len(prefix) {
		return name[len(prefix):]
	}
	return name
}

// stoppedForResources refuses a resources change while the workspace
// holds an execution: what an execution receives is always exactly what
// its spec says.
func stoppedForResources(ctx context.Context, tx store.Tx, r *record) error {
	switch r.ws.State {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
		return nil
	}
	return precondition(observed(ctx, tx, r), "workspace %s is %s; resources change only while it is STOPPED or FAILED", r.ws.WorkspaceId, StateName(r.ws.State))
}

// UpdateMemory replaces memory_bytes under CAS on resources_revision; it
// takes effect at the next start, where capacity is judged.
func UpdateMemory[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, expected, memory uint64, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	if memory%MiB != 0 || memory < MinMemoryBytes {
		return zero, invalid("memory_bytes %d must be a whole number of MiB and at least 128 MiB", memory)
	}
	return updateResources(ctx, s, w, id, expected, respond, func(ctx context.Context, tx store.Tx, r *record, res *ctrlv1.ResourceRequest) error {
		if res.MemoryBytes == memory {
			return nil
		}
		if r.ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
			// The running execution gets a raise at once; lowering the
			// limit under a guest's feet waits for a stop.
			if memory < res.MemoryBytes {
				return precondition(observed(ctx, tx, r), "workspace %s is AVAILABLE; memory is lowered only while it is STOPPED or FAILED, and raised at any time it is AVAILABLE", r.ws.WorkspaceId)
			}
			if err := s.fitsMore(ctx, tx, r, scheduler.Request{MemoryBytes: memory - res.MemoryBytes}); err != nil {
				return err
			}
		} else if err := stoppedForResources(ctx, tx, r); err != nil {
			return err
		}
		res.MemoryBytes = memory
		r.ws.Spec.ResourcesRevision++
		r.row.MemoryBytes = memory
		return nil
	})
}

// updateResources is what UpdateMemory and ResizeWritableLayer share: the
// required expected_resources_revision, a live workspace, and CAS on
// resources_revision before change edits the resources.
func updateResources[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, expected uint64, respond func(*ctrlv1.Workspace) R,
	change func(ctx context.Context, tx store.Tx, r *record, res *ctrlv1.ResourceRequest) error) (R, error) {
	if expected == 0 {
		var zero R
		return zero, invalid("expected_resources_revision is required: send the revision you observed")
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		if err := live(ctx, tx, r); err != nil {
			return err
		}
		if rev := r.ws.Spec.ResourcesRevision; rev != expected {
			return command.Aborted("resources_revision", expected, rev)
		}
		return change(ctx, tx, r, r.ws.Spec.Resources)
	}, respond)
}

// ResizeWritableLayer grows writable_layer_bytes under CAS on
// resources_revision. The added bytes are reserved on the workspace's host
// now; the host grows the layer at the next start.
func ResizeWritableLayer[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, expected, bytes uint64, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	if bytes == 0 || bytes%MiB != 0 {
		return zero, invalid("writable_layer_bytes %d must be a positive whole number of MiB", bytes)
	}
	return updateResources(ctx, s, w, id, expected, respond, func(ctx context.Context, tx store.Tx, r *record, res *ctrlv1.ResourceRequest) error {
		current := max(res.WritableLayerBytes, r.row.LayerBytes)
		for _, t := range r.ws.RetentionTiers {
			if t.Kind == ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT {
				current = max(current, t.GetCapacityBytes())
			}
		}
		switch {
		case bytes == current:
			return nil
		case bytes < current:
			return invalid("writable_layer_bytes %d is below the layer's %d bytes: the layer only grows", bytes, current)
		}
		if err := stoppedForResources(ctx, tx, r); err != nil {
			return err
		}
		if err := s.fitsMore(ctx, tx, r, scheduler.Request{LayerBytes: bytes - r.row.LayerBytes}); err != nil {
			return err
		}
		res.WritableLayerBytes = bytes
		r.ws.Spec.ResourcesRevision++
		r.row.LayerBytes = bytes
		return nil
	})
}
