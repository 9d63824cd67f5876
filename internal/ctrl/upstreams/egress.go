package upstreams

import (
	"context"
	"fmt"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// Egresses is the Egress service.
type Egresses = Service[*ctrlv1.EgressSpec]

// NewEgresses returns the Egress service; checker range-checks endpoints.
func NewEgresses(st store.Store, pages *pagetoken.Codec, checker *netcheck.Checker, changes *changes.Broker) *Egresses {
	return &Egresses{Kind: egressKind(checker), Store: st, Pages: pages, Changes: changes}
}

func egressKind(checker *netcheck.Checker) Kind[*ctrlv1.EgressSpec] {
	return Kind[*ctrlv1.EgressSpec]{
		Store:    store.KindEgress,
		Noun:     "Egress",
		IDPrefix: "egr",
		NewSpec:  func() *ctrlv1.EgressSpec { return new(ctrlv1.EgressSpec) },
		Check:    CheckEgressSpec,
		CheckSlow: func(ctx context.Context, spec *ctrlv1.EgressSpec) error {
			return CheckEgressEndpoint(ctx, checker, spec)
		},
		CheckUpdate: func(ctx context.Context, tx store.Tx, projectID, id string, old, new *ctrlv1.EgressSpec) error {
			if !old.GetUdpEnabled() || new.GetUdpEnabled() {
				return nil
			}
			return refuseWhileReferenced(ctx, tx, projectID, store.PolicyReference{Kind: store.RefEgressUDP, TargetID: id},
				func(ws string) string {
					return fmt.Sprintf("udp_enabled cannot be turned off: the network policy of workspace %q sends a udp Resolver's queries through Egress %q", ws, id)
				})
		},
		Referenced: store.RefEgress,
		Redact:     RedactEgressSpec,
	}
}
