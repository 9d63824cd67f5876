// Package ctrl serves the kibotos.ctrl.v1 API over Connect: thin handlers
// that turn requests into calls of the services beneath (objects,
// command) and their results into responses. No SQL and no rule lives here.
package ctrl

import (
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/objects"
	"github.com/kibotos/kibotos/internal/pagetoken"
	"github.com/kibotos/kibotos/internal/store"
)

// Deps is what the handlers need.
type Deps struct {
	Store   store.Store
	Pages   *pagetoken.Codec
	Checker *netcheck.Checker
	// Changed is called after every committed Egress or Resolver write.
	Changed func()
}

// NewEgressService returns the EgressService handler.
func NewEgressService(d Deps) *EgressService {
	return &EgressService{objects: &objects.Service[*ctrlv1.EgressSpec]{Kind: egressKind(d.Checker), Store: d.Store, Pages: d.Pages, Changed: d.Changed}}
}

// NewResolverService returns the ResolverService handler.
func NewResolverService(d Deps) *ResolverService {
	return &ResolverService{objects: &objects.Service[*ctrlv1.ResolverSpec]{Kind: resolverKind(), Store: d.Store, Pages: d.Pages, Changed: d.Changed}}
}
