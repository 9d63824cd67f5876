package workspaces

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// networkAssignment resolves a workspace's policy into what its host
// enforces: the policy and every Egress and Resolver it references at their
// current revisions. A reference that no longer resolves is left out; the
// host then refuses to apply the policy and reports it.
func networkAssignment(ctx context.Context, tx store.Tx, r *record) (*hostv1.NetworkAssignment, error) {
	policy := r.ws.GetSpec().GetNetworkPolicy()
	n := &hostv1.NetworkAssignment{Policy: proto.CloneOf(policy), DrainSeconds: r.book.NetworkDrainSeconds}
	for _, e := range policy.GetEgresses() {
		spec := &ctrlv1.EgressSpec{}
		o, err := liveSpec(ctx, tx, store.KindEgress, r.row.ProjectID, e.EgressId, spec)
		if err != nil || o == nil {
			return nil, err
		}
		n.Egresses = append(n.Egresses, &hostv1.EgressAssignment{EgressId: o.ID, Revision: o.Revision, Spec: spec, DrainSeconds: o.DrainSeconds})
	}
	for _, res := range policy.GetResolvers() {
		spec := &ctrlv1.ResolverSpec{}
		o, err := liveSpec(ctx, tx, store.KindResolver, r.row.ProjectID, res.ResolverId, spec)
		if err != nil || o == nil {
			return nil, err
		}
		n.Resolvers = append(n.Resolvers, &hostv1.ResolverAssignment{ResolverId: o.ID, Revision: o.Revision, Spec: spec, DrainSeconds: o.DrainSeconds})
	}
	return n, nil
}

// liveSpec reads an object and decodes its spec into spec; nil when it is
// missing or deleted.
func liveSpec(ctx context.Context, tx store.Tx, kind store.Kind, projectID, id string, spec proto.Message) (*store.Object, error) {
	o, err := tx.Object(ctx, kind, projectID, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && o.Deleted() {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &o, proto.Unmarshal(o.Spec, spec)
}

// applyNetwork records what a running execution's slot has in force: the
// confirmed policy status (absent until the first confirmation and after a
// failed application) and the current runs of Egress and Resolver faults.
// A run already recorded keeps its observed_at while it lasts.
func applyNetwork(ws *ctrlv1.Workspace, n *hostv1.NetworkReport, now time.Time) {
	ws.NetworkPolicyStatus = proto.CloneOf(n.GetStatus())
	var eo []*ctrlv1.EgressObservation
	for _, o := range n.GetEgressObservations() {
		o = proto.CloneOf(o)
		o.ObservedAt = timestamppb.New(now)
		for _, old := range ws.EgressObservations {
			if old.EgressId == o.EgressId && proto.Equal(old.FailingSince, o.FailingSince) {
				o = old
			}
		}
		eo = append(eo, o)
	}
	var ro []*ctrlv1.ResolverObservation
	for _, o := range n.GetResolverObservations() {
		o = proto.CloneOf(o)
		o.ObservedAt = timestamppb.New(now)
		for _, old := range ws.ResolverObservations {
			if old.ResolverId == o.ResolverId && proto.Equal(old.Path, o.Path) && proto.Equal(old.FailingSince, o.FailingSince) {
				o = old
			}
		}
		ro = append(ro, o)
	}
	ws.EgressObservations, ws.ResolverObservations = eo, ro
}

// clearNetwork drops the observations of an execution that no longer runs.
func clearNetwork(ws *ctrlv1.Workspace) {
	ws.NetworkPolicyStatus, ws.EgressObservations, ws.ResolverObservations = nil, nil, nil
}
