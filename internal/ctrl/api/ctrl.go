// Package api serves the control plane's Connect APIs (kibotos.ctrl.v1,
// kibotos.admin.v1 and kibotos.host.v1): thin handlers that turn requests
// into calls of the resource services beneath and their results into
// responses. No SQL lives here.
package api

import (
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/objects"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/netcheck"
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
