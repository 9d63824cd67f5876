package sdk

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// volumePoll is the pause between two reads of a Volume being created.
const volumePoll = 250 * time.Millisecond

// VolumeOptions describe a new Volume; zero fields take the defaults.
type VolumeOptions struct {
	// CapacityBytes is a whole number of MiB; 0 is the storage profile's.
	CapacityBytes uint64
	// Labels and Annotations are stored with the Volume.
	Labels, Annotations map[string]string
}

// CreateVolume creates a Volume on its own and waits until a host has
// created it (AVAILABLE). CreateOptions.Volume binds it to a Workspace
// (mode BOUND), or creates one with the Workspace (mode NEW).
func (c *Client) CreateVolume(ctx context.Context, o VolumeOptions) (*ctrlv1.Volume, error) {
	resp, err := c.volumes().CreateVolume(ctx, connect.NewRequest(&ctrlv1.CreateVolumeRequest{
		Command: commandMetadata(""), Spec: &ctrlv1.VolumeSpec{CapacityBytes: o.CapacityBytes},
		Labels: o.Labels, Annotations: o.Annotations,
	}))
	if err != nil {
		return nil, err
	}
	v := resp.Msg.GetVolume()
	for v.GetState() == ctrlv1.VolumeState_VOLUME_STATE_CREATING {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(volumePoll):
		}
		if v, err = c.Volume(ctx, v.GetVolumeId()); err != nil {
			return nil, err
		}
	}
	if v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
		return v, fmt.Errorf("volume %s is %v, not AVAILABLE: %v", v.GetVolumeId(), v.GetState(), v.GetFailure())
	}
	return v, nil
}

// Volume returns the Volume id; an unknown one is not_found.
func (c *Client) Volume(ctx context.Context, id string) (*ctrlv1.Volume, error) {
	resp, err := c.volumes().GetVolume(ctx, connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: id}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetVolume(), nil
}

// ListVolumes returns the project's Volumes, every page of them; with a
// selector, only those carrying each of its entries as a label.
func (c *Client) ListVolumes(ctx context.Context, selector map[string]string) ([]*ctrlv1.Volume, error) {
	var all []*ctrlv1.Volume
	req := &ctrlv1.ListVolumesRequest{LabelSelector: selector}
	for {
		resp, err := c.volumes().ListVolumes(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		all = append(all, resp.Msg.GetVolumes()...)
		if req.PageToken = resp.Msg.GetNextPageToken(); req.PageToken == "" {
			return all, nil
		}
	}
}

// DeleteVolume deletes a Volume no Workspace binds, and returns it as
// stored (DELETING or DELETED).
func (c *Client) DeleteVolume(ctx context.Context, id string) (*ctrlv1.Volume, error) {
	resp, err := c.volumes().DeleteVolume(ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Command: commandMetadata(""), VolumeId: id}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetVolume(), nil
}
