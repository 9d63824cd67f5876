package workspaces

// This file is workspace creation: the checks of a request, the choice of
// template revision, host and Volume, and the new record.

import (
	"context"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
)

// Create validates, resolves the template, places the workspace on a host
// and stores it in CREATING, all in one command.
func Create[R proto.Message](ctx context.Context, s *Service, w Write[R], spec *ctrlv1.WorkspaceCreateSpec,
	labels, annotations map[string]string, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	cmd, err := resource.CommandOf(ctx, w)
	if err != nil {
		return zero, err
	}
	req, err := checkCreate(spec, labels, annotations)
	if err != nil {
		return zero, err
	}
	// A retry replays before the slow checks, which DNS could now answer
	// differently.
	if resp, found, err := command.Replay(ctx, s.Store, cmd); err != nil || found {
		return resp, err
	}
	if err := checkExpiration(spec.Expiration, s.Now.UTC()); err != nil {
		return zero, err
	}
	if err := checkDirectUpstreams(ctx, s.Store, s.Checker, cmd.ProjectID, spec.NetworkPolicy); err != nil {
		return zero, err
	}
	var id string
	resp, err := command.Run(ctx, s.Store, cmd, func(ctx context.Context, tx store.Tx) (R, error) {
		r, err := s.create(ctx, tx, cmd.ProjectID, req)
		if err != nil {
			return zero, err
		}
		id = r.row.ID
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

// createRequest is a creation request that passed the checks that need
// neither the store nor the network.
type createRequest struct {
	spec        *ctrlv1.WorkspaceCreateSpec
	resources   *ctrlv1.ResourceRequest // with defaults filled
	volume      *ctrlv1.WorkspaceVolumeBinding
	labels      map[string]string
	annotations map[string]string
	// restore is the Transfer a restored workspace comes from.
	restore *Restore
}

// checkCreate runs the static checks of a creation request.
func checkCreate(spec *ctrlv1.WorkspaceCreateSpec, labels, annotations map[string]string) (createRequest, error) {
	if spec == nil {
		return createRequest{}, invalid("spec is required")
	}
	resources, err := checkResources(spec.Resources)
	if err != nil {
		return createRequest{}, err
	}
	if err := checkCapabilities(spec.Capabilities); err != nil {
		return createRequest{}, err
	}
	volume, err := checkVolume(spec.Volume, true)
	if err != nil {
		return createRequest{}, err
	}
	if err := resource.CheckMaps(labels, annotations); err != nil {
		return createRequest{}, err
	}
	return createRequest{spec: spec, resources: resources, volume: volume, labels: labels, annotations: annotations}, nil
}

// create stores a new workspace of the project: it resolves the template
// and the policy's references, places the workspace with its Volume, and
// stores the record in CREATING.
func (s *Service) create(ctx context.Context, tx store.Tx, projectID string, req createRequest) (*record, error) {
	spec := req.spec
	ref, image, err := templates.Resolve(ctx, tx, projectID, spec.Template)
	if err != nil {
		return nil, err
	}
	if err := checkDisplayCapabilities(spec.Capabilities, ref, image); err != nil {
		return nil, err
	}
	policy, refs, err := checkPolicy(ctx, tx, projectID, spec.NetworkPolicy)
	if err != nil {
		return nil, err
	}
	policy.Revision = 1
	id := ids.New("ws")
	host, layerBytes, volume, err := s.placeNew(ctx, tx, projectID, id, req)
	if err != nil {
		return nil, err
	}
	now := s.Now.UTC()
	ws := &ctrlv1.Workspace{
		WorkspaceId: id,
		Spec: &ctrlv1.WorkspaceSpec{
			Template: ref, Resources: req.resources, Capabilities: spec.Capabilities, Volume: volume,
			NetworkPolicy: policy, ResourcesRevision: 1, LaunchBindingVersion: 1, BindingRevision: 1,
		},
		State:               ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING,
		CreatedAt:           timestamppb.New(now),
		UpdatedAt:           timestamppb.New(now),
		Labels:              req.labels,
		Annotations:         req.annotations,
		LabelsRevision:      1,
		AnnotationsRevision: 1,
		RetentionTiers:      retentionTiers(nil, 0, false),
	}
	// The data-plane key rides on the first assignment, so the host knows it
	// before the workspace is AVAILABLE and a session issued at once works.
	r := &record{ws: ws, book: bookkeeping{Desired: DesiredRunning, Target: 1, Image: image,
		DataPlane: DataPlane{Key: NewDataPlaneKey()}, Restore: req.restore}}
	r.row = store.Workspace{ProjectID: projectID, ID: id, TemplateID: ref.TemplateId, HostID: host,
		CPUMillis: req.resources.CpuMillis, MemoryBytes: req.resources.MemoryBytes, LayerBytes: layerBytes,
		CreatedAt: now, UpdatedAt: now}
	if spec.Expiration != nil {
		ws.Expiration = &ctrlv1.WorkspaceExpiration{Policy: spec.Expiration, Revision: 1}
		r.row.ExpiresAt = spec.Expiration.Deadline.AsTime()
	}
	if err := s.bindLaunch(ctx, tx, r); err != nil {
		return nil, err
	}
	row, err := r.encode()
	if err != nil {
		return nil, err
	}
	if err := tx.CreateWorkspace(ctx, row); err != nil {
		return nil, err
	}
	return r, tx.SetPolicyReferences(ctx, projectID, id, refs)
}

// placeNew places the new workspace id on a host and binds its Volume: an
// existing one (which decides the host) or a new one in the default pool.
// It returns the host, the writable layer's capacity there and the
// workspace's volume spec as stored.
func (s *Service) placeNew(ctx context.Context, tx store.Tx, projectID, id string, req createRequest) (string, uint64, *ctrlv1.WorkspaceVolumeBinding, error) {
	volume := proto.CloneOf(req.volume) // a retried transaction starts from the request again
	need := placement{capabilities: req.spec.Capabilities.GetRequired()}
	var bound *volumes.Record
	var err error
	switch volume.Mode {
	case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND:
		if bound, err = s.Volumes.Bindable(ctx, tx, projectID, volume.VolumeId, ""); err != nil {
			return "", 0, nil, err
		}
		need.pool, need.host = bound.Pool(), bound.Holder()
	case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW:
		need.pool = s.Volumes.DefaultPool
	}
	host, layerBytes, err := s.place(ctx, tx, req.resources, need)
	if err != nil {
		return "", 0, nil, err
	}
	switch volume.Mode {
	case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND:
		err = s.Volumes.Bind(ctx, tx, bound, id, true)
	case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW:
		var restoreBytes uint64
		if req.restore != nil {
			restoreBytes = req.restore.VolumeBytes
		}
		bound, err = s.Volumes.CreateForWorkspace(ctx, tx, projectID, host, id, restoreBytes)
		if err == nil {
			volume.Mode, volume.VolumeId = ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, bound.V.VolumeId
		}
	}
	return host, layerBytes, volume, err
}
