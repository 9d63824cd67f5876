// Package api serves the control plane's Connect APIs (kibotos.ctrl.v1,
// kibotos.admin.v1 and kibotos.host.v1): thin handlers that turn requests
// into calls of the resource services beneath and their results into
// responses. No rule and no SQL lives here.
package api

import (
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/upstreams"
)

// NewEgressService returns the EgressService handler.
func NewEgressService(egresses *upstreams.Egresses) *EgressService {
	return &EgressService{kind: upstreamKind[*ctrlv1.EgressSpec, *ctrlv1.Egress]{egresses, toEgress}}
}

// NewResolverService returns the ResolverService handler.
func NewResolverService(resolvers *upstreams.Resolvers) *ResolverService {
	return &ResolverService{kind: upstreamKind[*ctrlv1.ResolverSpec, *ctrlv1.Resolver]{resolvers, toResolver}}
}
