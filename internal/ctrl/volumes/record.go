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
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
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
}

type envelope struct {
	Volume []byte      `json:"volume"`
	Book   Bookkeeping `json:"book"`
}

// decode reads a row.
func decode(row store.Volume) (*Record, error) {
	var env envelope
	if err := json.Unmarshal(row.Body, &env); err != nil {
		return nil, fmt.Errorf("volume %s: %w", row.ID, err)
	}
	v := new(ctrlv1.Volume)
	if err := proto.Unmarshal(env.Volume, v); err != nil {
		return nil, fmt.Errorf("volume %s: %w", row.ID, err)
	}
	return &Record{Row: row, V: v, Book: env.Book}, nil
}

// encode serializes the record into its row.
func (r *Record) encode() (store.Volume, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(r.V)
	if err != nil {
		return store.Volume{}, err
	}
	env, err := json.Marshal(envelope{Volume: body, Book: r.Book})
	if err != nil {
		return store.Volume{}, err
	}
	row := r.Row
	row.Body = env
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
