package server_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestVolumeService covers the VolumeService calls that need no host on
// both backends: creation from the pool's profile, replay, reads, lists,
// CAS on labels, tenancy, refusals, and deletion keeping the Volume
// readable.
func TestVolumeService(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		vols := ctrlv1connect.NewVolumeServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(e.admin)))
		// No host has a storage pool yet.
		_, err := vols.CreateVolume(ctx, connect.NewRequest(&ctrlv1.CreateVolumeRequest{Command: cmd(), Spec: &ctrlv1.VolumeSpec{}}))
		var ce *connect.Error
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !errors.As(err, &ce) || len(ce.Details()) != 1 {
			t.Fatalf("CreateVolume without a pool: %v", err)
		}
		if d, _ := ce.Details()[0].Value(); d.(*ctrlv1.ErrorDetail).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE {
			t.Errorf("detail: %v", d)
		}
		wsc := e.workspaces()

		// No capacity: the pool's profile; no pool: the default.
		req := &ctrlv1.CreateVolumeRequest{Command: cmd(), Spec: &ctrlv1.VolumeSpec{}, Labels: map[string]string{"team": "a"}}
		first, err := vols.CreateVolume(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		v := first.Msg.Volume
		if v.State != ctrlv1.VolumeState_VOLUME_STATE_CREATING || v.Spec.CapacityBytes != 256<<20 || v.Spec.StoragePool != "default" ||
			v.LabelsRevision != 1 || v.AnnotationsRevision != 1 || v.Observation != nil {
			t.Fatalf("created: %v", v)
		}
		again, err := vols.CreateVolume(ctx, connect.NewRequest(req))
		if err != nil || !proto.Equal(again.Msg, first.Msg) {
			t.Errorf("replay: %v, %v", again, err)
		}
		reuse := proto.CloneOf(req)
		reuse.Spec.CapacityBytes = 512 << 20
		if _, err := vols.CreateVolume(ctx, connect.NewRequest(reuse)); connect.CodeOf(err) != connect.CodeAlreadyExists {
			t.Errorf("command reuse: %v", err)
		}
		other, err := vols.CreateVolume(ctx, connect.NewRequest(&ctrlv1.CreateVolumeRequest{Command: cmd(),
			Spec: &ctrlv1.VolumeSpec{CapacityBytes: 64 << 20, StoragePool: "default"}}))
		if err != nil || other.Msg.Volume.Spec.CapacityBytes != 64<<20 {
			t.Fatalf("explicit capacity: %v, %v", other, err)
		}

		list, err := vols.ListVolumes(ctx, connect.NewRequest(&ctrlv1.ListVolumesRequest{LabelSelector: map[string]string{"team": "a"}}))
		if err != nil || len(list.Msg.Volumes) != 1 || list.Msg.Volumes[0].VolumeId != v.VolumeId {
			t.Errorf("list by label: %v, %v", list, err)
		}
		page, err := vols.ListVolumes(ctx, connect.NewRequest(&ctrlv1.ListVolumesRequest{PageSize: 1}))
		if err != nil || len(page.Msg.Volumes) != 1 || page.Msg.NextPageToken == "" {
			t.Fatalf("first page: %v, %v", page, err)
		}
		next, err := vols.ListVolumes(ctx, connect.NewRequest(&ctrlv1.ListVolumesRequest{PageSize: 1, PageToken: page.Msg.NextPageToken}))
		if err != nil || len(next.Msg.Volumes) != 1 || next.Msg.NextPageToken != "" || next.Msg.Volumes[0].VolumeId == page.Msg.Volumes[0].VolumeId {
			t.Errorf("second page: %v, %v", next, err)
		}

		labels := func(expected uint64, l map[string]string) (*ctrlv1.Volume, error) {
			resp, err := vols.UpdateVolumeLabels(ctx, connect.NewRequest(&ctrlv1.UpdateVolumeLabelsRequest{Command: cmd(),
				VolumeId: v.VolumeId, ExpectedLabelsRevision: expected, Labels: l}))
			if err != nil {
				return nil, err
			}
			return resp.Msg.Volume, nil
		}
		if got, err := labels(1, map[string]string{"team": "b"}); err != nil || got.LabelsRevision != 2 {
			t.Errorf("labels: %v, %v", got, err)
		}
		if _, err := labels(1, map[string]string{"team": "c"}); connect.CodeOf(err) != connect.CodeAborted {
			t.Errorf("stale labels_revision: %v", err)
		}

		// Another project never sees it.
		_, token := e.project("volumes-other", adminv1.Role_ROLE_ADMIN)
		foreign := ctrlv1connect.NewVolumeServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(token)))
		if _, err := foreign.GetVolume(ctx, connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: v.VolumeId})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("another project's GetVolume: %v", err)
		}
		if _, err := foreign.DeleteVolume(ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Command: cmd(), VolumeId: v.VolumeId})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("another project's DeleteVolume: %v", err)
		}
		foreignWS := ctrlv1connect.NewWorkspaceServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(token)))
		bound := &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: v.VolumeId}
		spec := &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20}, Volume: bound}
		if _, err := foreignWS.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: spec})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("another project binding it: %v", err)
		}
		// Not created yet: no binding.
		if _, err := wsc.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: spec})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("binding a CREATING volume: %v", err)
		}
		if _, err := vols.ResizeVolume(ctx, connect.NewRequest(&ctrlv1.ResizeVolumeRequest{Command: cmd(), VolumeId: v.VolumeId, CapacityBytes: 1 << 30})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("resizing a CREATING volume: %v", err)
		}

		del, err := vols.DeleteVolume(ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Command: cmd(), VolumeId: v.VolumeId}))
		if err != nil || del.Msg.Volume.State != ctrlv1.VolumeState_VOLUME_STATE_DELETING {
			t.Fatalf("delete: %v, %v", del, err)
		}
		got, err := vols.GetVolume(ctx, connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: v.VolumeId}))
		if err != nil || got.Msg.Volume.Labels["team"] != "b" {
			t.Errorf("deleting volume read back: %v, %v", got, err)
		}
		if _, err := labels(2, nil); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("labels of a DELETING volume: %v", err)
		}
	})
}
