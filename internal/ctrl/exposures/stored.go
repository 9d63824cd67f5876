package exposures

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/exposureabi"
)

// stored is the body of an exposure's row: what the row's columns do not
// hold. The token itself is never stored.
type stored struct {
	Auth ctrlv1.ExposureAuth `json:"auth"`
	// TokenSHA256 is the hash of the token under TOKEN
	// (exposureabi.Sum).
	TokenSHA256 []byte `json:"token_sha256,omitempty"`
}

func (s stored) encode() ([]byte, error) { return json.Marshal(s) }

func decode(row store.Exposure) (stored, error) {
	var s stored
	if err := json.Unmarshal(row.Body, &s); err != nil {
		return stored{}, fmt.Errorf("exposure %s: %w", row.ID, err)
	}
	return s, nil
}

// host is where an exposure's URL points: what the host running its
// workspace registered.
type host struct {
	endpoint, domain string
}

// view is the exposure as callers read it, without its token; its URL is
// empty when the host serves no data plane.
func view(row store.Exposure, s stored, h host) *ctrlv1.Exposure {
	e := &ctrlv1.Exposure{
		ExposureId: row.ID, WorkspaceId: row.WorkspaceID, Port: row.Port, Auth: s.Auth,
		CreatedAt: timestamppb.New(row.CreatedAt), Persistent: row.Persistent,
	}
	if h.endpoint != "" {
		e.Url, _ = exposureabi.URL(h.endpoint, h.domain, row.ID, row.WorkspaceID, row.Port)
	}
	return e
}

// assignment is the exposure as the host checks and routes it.
func assignment(row store.Exposure, s stored) *hostv1.ExposureAssignment {
	return &hostv1.ExposureAssignment{ExposureId: row.ID, Port: row.Port, Auth: s.Auth, TokenSha256: s.TokenSHA256}
}
