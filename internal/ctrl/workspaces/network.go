package workspaces

import (
	"context"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// UpdateNetworkPolicy replaces the network policy under CAS on its
// revision, validated as on create. Equal content keeps the revision and
// changes nothing. Different content increments the revision, replaces the
// workspace's policy references and records drain (absent = 600) as
// NetworkDrainSeconds. Only a workspace that is going away refuses it: a
// running execution applies the new revision live, a stopped one at its
// next start.
func UpdateNetworkPolicy[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, expected uint64,
	policy *ctrlv1.NetworkPolicy, drain *uint32, respond func(*ctrlv1.Workspace) R) (R, error) {
	var zero R
	cmd, err := resource.CommandOf(ctx, w)
	if err != nil {
		return zero, err
	}
	if expected == 0 {
		return zero, invalid("expected_revision is required: send the network policy revision you observed")
	}
	if policy == nil {
		return zero, invalid("policy is required: send the complete replacement")
	}
	seconds, err := resource.DrainSeconds(drain)
	if err != nil {
		return zero, err
	}
	// A retry replays before the slow check, which DNS could now answer
	// differently.
	if resp, found, err := command.Replay(ctx, s.Store, cmd); err != nil || found {
		return resp, err
	}
	if err := checkDirectUpstreams(ctx, s.Store, s.Checker, cmd.ProjectID, policy); err != nil {
		return zero, err
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *record) error {
		if err := live(ctx, tx, r); err != nil {
			return err
		}
		current := r.ws.Spec.NetworkPolicy
		if rev := current.GetRevision(); rev != expected {
			return command.Aborted("network_policy.revision", expected, rev)
		}
		next, refs, err := checkPolicy(ctx, tx, r.row.ProjectID, policy)
		if err != nil {
			return err
		}
		next.Revision = current.GetRevision()
		if proto.Equal(next, current) {
			return nil
		}
		next.Revision++
		r.ws.Spec.NetworkPolicy = next
		r.book.NetworkDrainSeconds = seconds
		return tx.SetPolicyReferences(ctx, r.row.ProjectID, r.row.ID, refs)
	}, respond)
}
