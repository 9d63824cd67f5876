// Package transfers is ctrl's TransferService: it exports a STOPPED
// Workspace into an artifact (internal/artifact) in the deployment's blob
// store, imports an artifact uploaded from elsewhere, restores a new
// Workspace from one, and deletes and expires them.
//
// ctrl only orchestrates: an export is a TransferAssignment to the host
// that keeps the Workspace's layer, which reads the layer and the Volume
// and uploads the artifact (PutArtifact); a restore is an ExecutionRestore
// in the new Workspace's assignment, with which that host makes the layer
// and the Volume from the artifact (OpenArtifact). Every artifact is
// written under a staging key, verified as it streams (its digest and
// every checksum inside it), then committed under its final key; only
// then is the Transfer COMPLETE or IMPORTED. A FAILED, DELETED or EXPIRED
// Transfer holds no artifact, and Collect removes any blob no Transfer
// holds, so a crash at any point leaves nothing behind for long.
package transfers

import (
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Record is a Transfer as ctrl keeps it.
type Record struct {
	Row  store.Transfer
	T    *ctrlv1.Transfer
	Book Bookkeeping
}

// Bookkeeping is what ctrl needs beyond the API resource.
type Bookkeeping struct {
	// Export is what the host exporting the Workspace needs, while the
	// Transfer is EXPORTING.
	Export *ExportWork `json:"export,omitempty"`
	// ReadyState is the state a restore that did not finish never leaves
	// behind: COMPLETE for an export, IMPORTED for an import.
	ReadyState ctrlv1.TransferState `json:"ready_state,omitempty"`
	// Stored is true while the committed artifact exists.
	Stored bool `json:"stored,omitempty"`
}

// ExportWork is the work of an export.
type ExportWork struct {
	LayerID string                  `json:"layer_id"`
	Volume  *hostv1.ExecutionVolume `json:"volume,omitempty"`
	// Manifest is the artifact's manifest entry.
	Manifest []byte `json:"manifest"`
	// TemplateBlobs are the blobs of the Template revision's image the
	// artifact carries (the image manifest first); none without
	// with_template.
	TemplateBlobs []string `json:"template_blobs,omitempty"`
	// Failures counts the attempts the host reported failed.
	Failures int `json:"failures,omitempty"`
}

func decode(row store.Transfer) (*Record, error) {
	r := &Record{Row: row, T: new(ctrlv1.Transfer)}
	if err := resource.DecodeBody("transfer", row.ID, row.Body, r.T, &r.Book); err != nil {
		return nil, err
	}
	return r, nil
}

// encode serializes the record into its row.
func (r *Record) encode() (store.Transfer, error) {
	body, err := resource.EncodeBody("transfer", r.T, r.Book)
	if err != nil {
		return store.Transfer{}, err
	}
	row := r.Row
	row.Body = body
	row.Labels = r.T.Labels
	row.Pending = pending(r.T.State)
	return row, nil
}

// pending reports whether a Transfer in state waits for work.
func pending(s ctrlv1.TransferState) bool {
	switch s {
	case ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, ctrlv1.TransferState_TRANSFER_STATE_IMPORTING,
		ctrlv1.TransferState_TRANSFER_STATE_RESTORING, ctrlv1.TransferState_TRANSFER_STATE_DELETING:
		return true
	}
	return false
}

// holdsArtifact reports whether a Transfer in state keeps a committed
// artifact (or is about to).
func holdsArtifact(s ctrlv1.TransferState) bool {
	switch s {
	case ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, ctrlv1.TransferState_TRANSFER_STATE_IMPORTING,
		ctrlv1.TransferState_TRANSFER_STATE_COMPLETE, ctrlv1.TransferState_TRANSFER_STATE_IMPORTED,
		ctrlv1.TransferState_TRANSFER_STATE_RESTORING, ctrlv1.TransferState_TRANSFER_STATE_RESTORED:
		return true
	}
	return false
}

// readable reports whether the artifact of a Transfer in state can be
// read.
func readable(s ctrlv1.TransferState) bool {
	switch s {
	case ctrlv1.TransferState_TRANSFER_STATE_COMPLETE, ctrlv1.TransferState_TRANSFER_STATE_IMPORTED,
		ctrlv1.TransferState_TRANSFER_STATE_RESTORING, ctrlv1.TransferState_TRANSFER_STATE_RESTORED:
		return true
	}
	return false
}

// View returns the Transfer as callers read it.
func (r *Record) View() *ctrlv1.Transfer { return proto.CloneOf(r.T) }

// StateName is a state without its enum prefix, for messages.
func StateName(s ctrlv1.TransferState) string {
	const prefix = "TRANSFER_STATE_"
	name := s.String()
	if len(name) > len(prefix) {
		return name[len(prefix):]
	}
	return name
}
