// Package volumes is ctrl's VolumeService: it validates and stores Volumes,
// turns them into the volume assignments of the hosts that hold them, and
// folds what those hosts report back into each Volume. The workspaces
// package binds Volumes to Workspaces through the functions in binding.go,
// inside its own transactions.
//
// A Volume's state moves only by commands (this service's, the binding
// changes of workspaces, the operator's DeclarePoolLost) and by the host
// confirming what a command asked (created, grown, deleted). The holder's
// observation (HEALTHY or DAMAGED) is diagnostic and never moves the state.
package volumes

import (
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// MiB is the unit of every capacity.
const MiB = 1 << 20

// MaxVolumeBytes is the largest capacity a Volume may have: a storage pool
// keeps each Volume as one disk image file, and on an ext4 host file
// system (4 KiB blocks) a file holds at most 16 TiB - 4 KiB; this is the
// largest whole number of MiB below that.
const MaxVolumeBytes = 16<<40 - MiB

// Record is a Volume as ctrl keeps it.
type Record struct {
	Row store.Volume
	// V is the API resource, observation included.
	V    *ctrlv1.Volume
	Book Bookkeeping
}

// Bookkeeping is what ctrl needs beyond the API resource.
type Bookkeeping struct {
	// UUID is the filesystem UUID the host creates the image with, so that
	// an image that opens as another filesystem is recognised as DAMAGED.
	UUID string `json:"uuid"`
	// Target is the capacity the host must reach: spec.capacity_bytes
	// except while a resize runs.
	Target uint64 `json:"target"`
	// Created is true once a host reported the image made. A Volume that
	// a NEW binding asked for and no launch created holds nothing to keep.
	Created bool `json:"created,omitempty"`
	// Attached is true while the execution of the bound Workspace holds
	// the Volume (kept by the workspaces package), so that a Volume
	// finishing its creation or a resize becomes ATTACHED, not AVAILABLE.
	Attached bool `json:"attached,omitempty"`
	// NewFor is the workspace whose NEW binding asked for the Volume;
	// empty for one CreateVolume made.
	NewFor string `json:"new_for,omitempty"`
	// Restoring is true for a Volume a restored workspace's launch makes
	// from a Transfer's artifact: the host never creates it empty.
	Restoring bool `json:"restoring,omitempty"`
	// Unknown is the state the Volume had when its host's lease ran out,
	// while it is UNKNOWN.
	Unknown ctrlv1.VolumeState `json:"unknown,omitempty"`
	// LostFrom is the host that held the Volume when its pool there was
	// declared lost, while it is LOST, so that declaring that host's pool
	// lost again is harmless once the host no longer reaches it.
	LostFrom string `json:"lost_from,omitempty"`
}

// decode reads a row.
func decode(row store.Volume) (*Record, error) {
	r := &Record{Row: row, V: new(ctrlv1.Volume)}
	if err := resource.DecodeBody("volume", row.ID, row.Body, r.V, &r.Book); err != nil {
		return nil, err
	}
	return r, nil
}

// encode serializes the record into its row.
func (r *Record) encode() (store.Volume, error) {
	body, err := resource.EncodeBody("volume", r.V, r.Book)
	if err != nil {
		return store.Volume{}, err
	}
	row := r.Row
	row.Body = body
	row.Labels = r.V.Labels
	row.WorkspaceID = r.V.BoundWorkspaceId
	row.Pool = r.V.GetSpec().GetStoragePool()
	return row, nil
}

// View returns the Volume as reads return it, with its observation.
func (r *Record) View() *ctrlv1.Volume { return proto.CloneOf(r.V) }

// commandView returns the Volume as command responses return it: without
// the observation.
func (r *Record) commandView() *ctrlv1.Volume {
	v := r.View()
	v.Observation = nil
	return v
}

// StateName is a state without its enum prefix, for messages.
func StateName(s ctrlv1.VolumeState) string {
	const prefix = "VOLUME_STATE_"
	name := s.String()
	if len(name) > len(prefix) {
		return name[len(prefix):]
	}
	return name
}
