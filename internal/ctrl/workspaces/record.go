// Package workspaces is ctrl's workspace service: it validates and stores
// what callers ask for (create, start, stop, delete, labels, expiration),
// places workspaces on hosts, turns that into each host's desired
// executions, and folds what hosts report back into the Workspace resource.
//
// The store keeps, per workspace, the API resource and ctrl's bookkeeping
// (the record). Everything a host needs is derived from records, so the
// flow is level-triggered: a restarted ctrl or host recomputes it.
package workspaces

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/sdk/sessiontoken"
)

// Desired is what ctrl wants of a workspace's execution.
type Desired string

// Desired states.
const (
	DesiredRunning Desired = "running"
	DesiredStopped Desired = "stopped"
	DesiredDeleted Desired = "deleted"
)

// record is a workspace as ctrl keeps it.
type record struct {
	row store.Workspace
	// ws is the API resource; reads return it (with labels from row).
	ws *ctrlv1.Workspace
	// book is ctrl's bookkeeping.
	book bookkeeping
}

// bookkeeping is what ctrl needs beyond the API resource.
type bookkeeping struct {
	Desired Desired `json:"desired"`
	// Target is the generation the assigned execution serves: the
	// workspace's generation + 1 while it starts, equal once AVAILABLE.
	Target uint64 `json:"target"`
	// Attempt counts the starts of Target after the first (a retry from
	// FAILED), so that each attempt is a new execution whose reports never
	// mix with the failed one's.
	Attempt uint64 `json:"attempt,omitempty"`
	// ExpirationRevision is the expiration's revision in records stored
	// when clearing an expiration dropped it from the resource; the
	// resource keeps it now, and revisions never go back.
	ExpirationRevision uint64 `json:"expiration_revision,omitempty"`
	// StopMode and StopCommand describe the stop in flight.
	StopMode    ctrlv1.StopMode `json:"stop_mode,omitempty"`
	StopCommand string          `json:"stop_command,omitempty"`
	// StopCause is why the workspace is stopping or deleting.
	StopCause ctrlv1.StopCause `json:"stop_cause,omitempty"`
	// LayerBytes is the writable layer's capacity once resolved on a host.
	Image templates.Image `json:"image"`
	// DataPlane authorizes the workspace's data-plane sessions.
	DataPlane DataPlane `json:"data_plane,omitzero"`
	// NetworkDrainSeconds is the drain_seconds of the
	// UpdateWorkspaceNetworkPolicy call that produced the current policy
	// revision: how long connections that revision moves off their path
	// keep running on it. The policy does not carry it, so ctrl keeps it
	// here for the host; zero at revision 1, which moves nothing.
	NetworkDrainSeconds uint32 `json:"network_drain_seconds,omitempty"`
	// Restore is the Transfer the workspace was restored from; nil for
	// one CreateWorkspace made.
	Restore *Restore `json:"restore,omitempty"`
	// Unknown is the state the workspace had when its host's lease ran
	// out, while it is UNKNOWN.
	Unknown ctrlv1.WorkspaceState `json:"unknown,omitempty"`
	// LayerMoves counts the starts that left the writable layer behind on
	// a LOST host for a new one elsewhere (layerID).
	LayerMoves uint32 `json:"layer_moves,omitempty"`
	// VolumeUncreated is set when the workspace's deletion began before a
	// launch finished creating the Volume its NEW binding asked for: the
	// Volume holds nothing to keep, and goes with it.
	VolumeUncreated bool `json:"volume_uncreated,omitempty"`
}

// layerID names the workspace's writable layer on its host: the
// workspace's ID, with the count of layers it left behind after the
// first. A layer it left on a host that comes back is never taken for
// its current one, should it return there.
func (r *record) layerID() string { return layerName(r.row.ID, r.book.LayerMoves) }

// layerName names the layer a workspace has after moves moves.
func layerName(workspaceID string, moves uint32) string {
	if moves == 0 {
		return workspaceID
	}
	return fmt.Sprintf("%s.%d", workspaceID, moves)
}

// DataPlane is a workspace's data-plane authorization state. ctrl keeps it
// in the workspace's record and sends it to the host in the assignment of
// the running execution, where the gateway checks session tokens against it
// (package sessions/token) without calling ctrl.
type DataPlane struct {
	// Key is the HMAC key of the workspace's session tokens. A workspace
	// gets one when it is created (one stored before that gets it when it
	// becomes AVAILABLE) and a new one with each new execution
	// (nextExecution); RotateDataPlane replaces it.
	Key []byte `json:"key,omitempty"`
	// Revoked lists the revoked sessions until RevokedGrace after they
	// expire.
	Revoked []RevokedSession `json:"revoked,omitempty"`
}

// RevokedSession is one revoked session.
type RevokedSession struct {
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expires_at"`
}

// RevokedGrace is how long a revoked session stays listed after it
// expires, so that a host whose clock runs behind ctrl's still refuses it.
const RevokedGrace = 5 * time.Minute

// NewDataPlaneKey returns a new random data-plane key.
func NewDataPlaneKey() []byte {
	key := make([]byte, sessiontoken.KeySize)
	rand.Read(key)
	return key
}

// Listed reports whether a revoked session is still listed at now.
func (r RevokedSession) Listed(now time.Time) bool {
	return now.Before(r.ExpiresAt.Add(RevokedGrace))
}

// revokedIDs returns the IDs of the revoked sessions listed at now.
func (d *DataPlane) revokedIDs(now time.Time) []string {
	var ids []string
	for _, r := range d.Revoked {
		if r.Listed(now) {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// EditDataPlane calls edit, inside tx, with a workspace of the project as
// callers read it, the host it is placed on (empty when none) and its
// data-plane state, and stores the state when edit reports a change. The
// API resource does not change, so neither do its revisions or
// updated_at. An unknown workspace or another project's is not_found.
// The caller publishes the workspace on Changes once tx commits, so that
// its host receives the new state at once.
func (s *Service) EditDataPlane(ctx context.Context, tx store.Tx, projectID, id string,
	edit func(ws *ctrlv1.Workspace, hostID string, dp *DataPlane) (changed bool, err error)) error {
	r, err := s.load(ctx, tx, projectID, id)
	if err != nil {
		return err
	}
	changed, err := edit(r.view(), r.row.HostID, &r.book.DataPlane)
	if err != nil || !changed {
		return err
	}
	row, err := r.encode()
	if err != nil {
		return err
	}
	return tx.UpdateWorkspace(ctx, row)
}

func decode(row store.Workspace) (*record, error) {
	r := &record{row: row, ws: new(ctrlv1.Workspace)}
	if err := resource.DecodeBody("workspace", row.ID, row.Body, r.ws, &r.book); err != nil {
		return nil, err
	}
	return r, nil
}

// decodeAll decodes the rows a store query returned.
func decodeAll(rows []store.Workspace, err error) ([]*record, error) {
	if err != nil {
		return nil, err
	}
	out := make([]*record, 0, len(rows))
	for _, row := range rows {
		r, err := decode(row)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// encode serializes the record into its row.
func (r *record) encode() (store.Workspace, error) {
	body, err := resource.EncodeBody("workspace", r.ws, r.book)
	if err != nil {
		return store.Workspace{}, err
	}
	row := r.row
	row.Body = body
	row.Labels = r.ws.Labels
	row.Running = r.book.Desired == DesiredRunning
	return row, nil
}

// view returns the resource as callers read it. A DELETED workspace's
// tiers are marked at each read, so that one deleted by a build that kept
// them as they were reads the same.
func (r *record) view() *ctrlv1.Workspace {
	ws := proto.CloneOf(r.ws)
	if ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		markDeleted(ws.RetentionTiers)
	}
	return ws
}
