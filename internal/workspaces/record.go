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
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// Desired is what ctrl wants of a workspace's execution.
type Desired string

// Desired states.
const (
	DesiredRunning Desired = "running"
	DesiredStopped Desired = "stopped"
	DesiredDeleted Desired = "deleted"
)

// Image is the template revision a workspace runs, as hosts need it.
type Image struct {
	TemplateID string   `json:"template_id"`
	Revision   string   `json:"revision"`
	Digest     string   `json:"digest"`
	Layers     []Layer  `json:"layers"`
	Env        []string `json:"env,omitempty"`
}

// Layer is one compressed layer blob of an Image.
type Layer struct {
	Digest string `json:"digest"`
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"`
}

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
	// StopMode and StopCommand describe the stop in flight.
	StopMode    ctrlv1.StopMode `json:"stop_mode,omitempty"`
	StopCommand string          `json:"stop_command,omitempty"`
	// StopCause is why the workspace is stopping or deleting.
	StopCause ctrlv1.StopCause `json:"stop_cause,omitempty"`
	// LayerBytes is the writable layer's capacity once resolved on a host.
	Image Image `json:"image"`
}

// envelope is the serialized form of a record's body.
type envelope struct {
	Workspace []byte      `json:"workspace"`
	Book      bookkeeping `json:"book"`
}

func decode(row store.Workspace) (*record, error) {
	var env envelope
	if err := json.Unmarshal(row.Body, &env); err != nil {
		return nil, fmt.Errorf("workspace %s: %w", row.ID, err)
	}
	ws := new(ctrlv1.Workspace)
	if err := proto.Unmarshal(env.Workspace, ws); err != nil {
		return nil, fmt.Errorf("workspace %s: %w", row.ID, err)
	}
	ws.Labels = row.Labels
	return &record{row: row, ws: ws, book: env.Book}, nil
}

// encode serializes the record into its row.
func (r *record) encode() (store.Workspace, error) {
	ws := proto.CloneOf(r.ws)
	ws.Labels = nil // kept in the row's label index
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(ws)
	if err != nil {
		return store.Workspace{}, err
	}
	env, err := json.Marshal(envelope{Workspace: body, Book: r.book})
	if err != nil {
		return store.Workspace{}, err
	}
	row := r.row
	row.Body = env
	row.Labels = r.ws.Labels
	row.Running = r.book.Desired == DesiredRunning
	return row, nil
}

// view returns the resource as callers read it.
func (r *record) view() *ctrlv1.Workspace { return proto.CloneOf(r.ws) }
