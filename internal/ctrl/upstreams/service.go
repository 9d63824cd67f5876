package upstreams

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

// Kind describes one kind of object.
type Kind[S proto.Message] struct {
	// Store is the kind's store tag.
	Store store.Kind
	// Noun names the kind in messages ("Egress").
	Noun string
	// IDPrefix starts every ID of the kind.
	IDPrefix string
	// NewSpec returns an empty spec to unmarshal into.
	NewSpec func() S
	// Check validates a spec's syntax and limits; its error becomes
	// invalid_argument.
	Check func(S) error
	// CheckSlow runs checks that may block (resolving a hostname) and so
	// run outside every transaction; its error becomes invalid_argument.
	// Nil when there are none.
	CheckSlow func(context.Context, S) error
	// CheckUpdate refuses a spec change that references forbid (for example
	// turning off udp_enabled while a policy sends udp queries through the
	// Egress). Nil when there are none.
	CheckUpdate func(ctx context.Context, tx store.Tx, projectID, id string, old, new S) error
	// Referenced names the reference that blocks deletion.
	Referenced store.RefKind
	// Redact returns the spec as reads return it.
	Redact func(S) S
}

// Object is one stored object with its decoded, redacted spec.
type Object[S proto.Message] struct {
	store.Object
	Spec S
}

// Service runs a Kind's methods on a store.
type Service[S proto.Message] struct {
	Kind  Kind[S]
	Store store.Store
	Pages *pagetoken.Codec
	// Changes, when set, is told after every committed write, so that
	// hosts re-read the objects their executions use.
	Changes *changes.Broker
	// Now is the clock; nil is time.Now.
	Now resource.Clock
}

func callerProject(ctx context.Context) string {
	c, _ := auth.CallerFrom(ctx)
	return c.ProjectID
}

func invalid(err error) error { return connect.NewError(connect.CodeInvalidArgument, err) }

func (s *Service[S]) notFound(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s %q not found", s.Kind.Noun, id))
}

func (s *Service[S]) requireID(id string) error {
	if id == "" {
		return invalid(fmt.Errorf("%s ID is required", s.Kind.Noun))
	}
	return nil
}

// run replays a repeated command before slow checks, then executes the
// command and announces the change.
func run[S, R proto.Message](ctx context.Context, s *Service[S], m resource.Mutation[R], slow func(context.Context) error,
	exec func(ctx context.Context, tx store.Tx, projectID string) (R, error)) (R, error) {
	var zero R
	if slow != nil {
		cmd, err := resource.CommandOf(ctx, m)
		if err != nil {
			return zero, err
		}
		resp, found, err := command.Replay(ctx, s.Store, cmd)
		if err != nil || found {
			return resp, err
		}
		if err := slow(ctx); err != nil {
			return zero, invalid(err)
		}
	}
	resp, err := resource.Run(ctx, s.Store, m, exec)
	if err == nil && s.Changes != nil {
		// An Egress or Resolver change reaches the hosts that use it
		// through their assignment streams.
		s.Changes.Publish("")
	}
	return resp, err
}

// Create stores a new object at revision 1.
func Create[S, R proto.Message](ctx context.Context, s *Service[S], m resource.Mutation[R], spec S,
	labels, annotations map[string]string, respond func(Object[S]) R) (R, error) {
	var zero R
	if err := s.Kind.Check(spec); err != nil {
		return zero, invalid(err)
	}
	if err := resource.CheckMaps(labels, annotations); err != nil {
		return zero, err
	}
	body, err := proto.Marshal(spec)
	if err != nil {
		return zero, err
	}
	return run(ctx, s, m, s.slow(spec), func(ctx context.Context, tx store.Tx, projectID string) (R, error) {
		now := s.Now.UTC()
		o := store.Object{
			Kind: s.Kind.Store, ProjectID: projectID, ID: ids.New(s.Kind.IDPrefix),
			Spec: body, Revision: 1, Labels: labels, LabelsRevision: 1,
			Annotations: annotations, AnnotationsRevision: 1, CreatedAt: now, UpdatedAt: now,
		}
		if err := tx.CreateObject(ctx, o); err != nil {
			return zero, err
		}
		return respond(Object[S]{Object: o, Spec: s.Kind.Redact(spec)}), nil
	})
}

func (s *Service[S]) slow(spec S) func(context.Context) error {
	if s.Kind.CheckSlow == nil {
		return nil
	}
	return func(ctx context.Context) error { return s.Kind.CheckSlow(ctx, spec) }
}

// Get returns a live object.
func (s *Service[S]) Get(ctx context.Context, id string) (Object[S], error) {
	var o Object[S]
	err := s.Store.ViewCached(ctx, func(tx store.Tx) error {
		var err error
		o, err = s.load(ctx, tx, callerProject(ctx), id)
		return err
	})
	return s.redacted(o), err
}

// load reads a live object of the caller's project; deleted, missing and
// other projects' objects are all not_found.
func (s *Service[S]) load(ctx context.Context, tx store.Tx, projectID, id string) (Object[S], error) {
	if err := s.requireID(id); err != nil {
		return Object[S]{}, err
	}
	o, err := tx.Object(ctx, s.Kind.Store, projectID, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && o.Deleted() {
		return Object[S]{}, s.notFound(id)
	}
	if err != nil {
		return Object[S]{}, err
	}
	return s.decode(o)
}

func (s *Service[S]) decode(o store.Object) (Object[S], error) {
	spec := s.Kind.NewSpec()
	if err := proto.Unmarshal(o.Spec, spec); err != nil {
		return Object[S]{}, fmt.Errorf("%s %s: stored spec: %w", s.Kind.Noun, o.ID, err)
	}
	return Object[S]{Object: o, Spec: spec}, nil
}

func (s *Service[S]) redacted(o Object[S]) Object[S] {
	o.Spec = s.Kind.Redact(o.Spec)
	return o
}

// Page is one page of a List.
type Page[S proto.Message] struct {
	Objects []Object[S]
	Next    string
}

// List returns one page of live objects that carry every selector label.
func (s *Service[S]) List(ctx context.Context, pageSize uint32, token string, selector map[string]string) (Page[S], error) {
	objs, next, err := resource.ListPage(ctx, s.Store, s.Pages, string(s.Kind.Store), pageSize, token, selector,
		func(tx store.Tx, ctx context.Context, q store.ObjectQuery) ([]store.Object, error) {
			q.Kind = s.Kind.Store
			return tx.Objects(ctx, q)
		},
		func(o store.Object) string { return o.ID },
		func(o store.Object) int { return len(o.Spec) + meta.Bytes(o.Labels) + meta.Bytes(o.Annotations) },
		func(_ context.Context, _ store.Tx, o store.Object) (Object[S], error) {
			obj, err := s.decode(o)
			return s.redacted(obj), err
		})
	return Page[S]{Objects: objs, Next: next}, err
}

// Update replaces the spec under CAS on revision. Equal content keeps the
// revision; different content increments it and records drain as the
// drain of the replaced revision's connections.
func Update[S, R proto.Message](ctx context.Context, s *Service[S], m resource.Mutation[R], id string, expected uint64,
	spec S, drain *uint32, respond func(Object[S]) R) (R, error) {
	var zero R
	if err := s.requireID(id); err != nil {
		return zero, err
	}
	if expected == 0 {
		return zero, invalid(errors.New("expected_revision is required: send the revision you observed"))
	}
	if err := s.Kind.Check(spec); err != nil {
		return zero, invalid(err)
	}
	seconds, err := resource.DrainSeconds(drain)
	if err != nil {
		return zero, err
	}
	body, err := proto.Marshal(spec)
	if err != nil {
		return zero, err
	}
	return run(ctx, s, m, s.slow(spec), func(ctx context.Context, tx store.Tx, projectID string) (R, error) {
		o, err := s.load(ctx, tx, projectID, id)
		if err != nil {
			return zero, err
		}
		if o.Revision != expected {
			return zero, command.Aborted("revision", expected, o.Revision)
		}
		if !proto.Equal(o.Spec, spec) {
			if s.Kind.CheckUpdate != nil {
				if err := s.Kind.CheckUpdate(ctx, tx, projectID, id, o.Spec, spec); err != nil {
					return zero, err
				}
			}
			o.Object.Spec, o.Spec = body, spec
			o.Revision++
			o.DrainSeconds = seconds
			o.UpdatedAt = s.Now.UTC()
			if err := tx.UpdateObject(ctx, o.Object); err != nil {
				return zero, err
			}
		}
		return respond(s.redacted(o)), nil
	})
}

// Delete deletes an object no workspace policy references.
func Delete[S, R proto.Message](ctx context.Context, s *Service[S], m resource.Mutation[R], id string, respond func() R) (R, error) {
	var zero R
	if err := s.requireID(id); err != nil {
		return zero, err
	}
	return run(ctx, s, m, nil, func(ctx context.Context, tx store.Tx, projectID string) (R, error) {
		o, err := s.load(ctx, tx, projectID, id)
		if err != nil {
			return zero, err
		}
		err = refuseWhileReferenced(ctx, tx, projectID, store.PolicyReference{Kind: s.Kind.Referenced, TargetID: id},
			func(ws string) string {
				return fmt.Sprintf("%s %q is referenced by the network policy of workspace %q; remove it from every policy first", s.Kind.Noun, id, ws)
			})
		if err != nil {
			return zero, err
		}
		o.DeletedAt = s.Now.UTC()
		o.UpdatedAt = o.DeletedAt
		if err := tx.UpdateObject(ctx, o.Object); err != nil {
			return zero, err
		}
		return respond(), nil
	})
}

// UpdateMap replaces the labels or the annotations (field) under CAS on
// their revision.
func UpdateMap[S, R proto.Message](ctx context.Context, s *Service[S], m resource.Mutation[R], field resource.MapField,
	id string, expected uint64, value map[string]string, respond func(Object[S]) R) (R, error) {
	var zero R
	if err := s.requireID(id); err != nil {
		return zero, err
	}
	if err := field.CheckMapWrite(value, expected); err != nil {
		return zero, err
	}
	return run(ctx, s, m, nil, func(ctx context.Context, tx store.Tx, projectID string) (R, error) {
		o, err := s.load(ctx, tx, projectID, id)
		if err != nil {
			return zero, err
		}
		current, revision := field.Select(&o.Labels, &o.LabelsRevision, &o.Annotations, &o.AnnotationsRevision)
		before := *revision
		if err := field.Replace(current, revision, expected, value); err != nil {
			return zero, err
		}
		if *revision != before {
			o.UpdatedAt = s.Now.UTC()
			if err := tx.UpdateObject(ctx, o.Object); err != nil {
				return zero, err
			}
		}
		return respond(s.redacted(o)), nil
	})
}

// refuseWhileReferenced refuses a change while a workspace's network
// policy holds ref: failed_precondition with the message about that
// workspace, which is attached.
func refuseWhileReferenced(ctx context.Context, tx store.Tx, projectID string, ref store.PolicyReference, message func(workspaceID string) string) error {
	ws, err := tx.ReferencingWorkspaces(ctx, projectID, ref, 1)
	if err != nil || len(ws) == 0 {
		return err
	}
	return workspaces.InUse(ctx, tx, projectID, ws[0], "%s", message(ws[0]))
}
