package upstreams

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Resolvers is the Resolver service.
type Resolvers = Service[*ctrlv1.ResolverSpec]

// NewResolvers returns the Resolver service.
func NewResolvers(st store.Store, pages *pagetoken.Codec, changes *changes.Broker) *Resolvers {
	return &Resolvers{Kind: resolverKind(), Store: st, Pages: pages, Changes: changes}
}

func resolverKind() Kind[*ctrlv1.ResolverSpec] {
	return Kind[*ctrlv1.ResolverSpec]{
		Store:    store.KindResolver,
		Noun:     "Resolver",
		IDPrefix: "rsv",
		NewSpec:  func() *ctrlv1.ResolverSpec { return new(ctrlv1.ResolverSpec) },
		Check:    CheckResolverSpec,
		// A policy was checked against the Resolver's protocol (a udp one
		// needs an Egress with udp_enabled): while one references it, the
		// protocol stays.
		CheckUpdate: func(ctx context.Context, tx store.Tx, projectID, id string, old, new *ctrlv1.ResolverSpec) error {
			if protocolOf(old) == protocolOf(new) {
				return nil
			}
			return refuseWhileReferenced(ctx, tx, projectID, store.PolicyReference{Kind: store.RefResolver, TargetID: id},
				func(ws string) string {
					return fmt.Sprintf("Resolver %q is referenced by the network policy of workspace %q: its protocol cannot change while a policy references it", id, ws)
				})
		},
		Referenced: store.RefResolver,
		// A Resolver holds no secret: reads return it whole.
		Redact: proto.CloneOf[*ctrlv1.ResolverSpec],
	}
}

// protocolOf names the selected protocol branch of a spec.
func protocolOf(spec *ctrlv1.ResolverSpec) string {
	return fmt.Sprintf("%T", spec.GetProtocol())
}
