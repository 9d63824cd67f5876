// Package objects implements, once, the seven methods that Egresses and
// Resolvers share: create, get, list, update (CAS on revision, with a drain
// for connections on the replaced revision), delete (refused while a
// workspace policy references the object), and label and annotation
// replacement (CAS on their own revisions). A Kind supplies what differs:
// the spec type, its checks, and what reads must not return.
//
// Every error this package returns is a *connect.Error with its canonical
// code, or an internal error that the server reports as such.
package objects

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Page sizes of List.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Drain seconds of Update: 0 to MaxDrainSeconds, absent = DefaultDrainSeconds.
const (
	DefaultDrainSeconds = 600
	MaxDrainSeconds     = 3600
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
	// InUse builds the failed_precondition of a change a workspace of the
	// project stands in the way of, with the workspace attached.
	InUse func(ctx context.Context, tx store.Tx, projectID, workspaceID, format string, a ...any) error
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
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Changed, when set, is called after every committed write, so that
	// hosts re-read the objects their executions use.
	Changed func()
}

func (s *Service[S]) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// Mutation is what every write method shares: the command that carries it
// and how its response is built.
type Mutation[R proto.Message] struct {
	// Method is the full procedure name.
	Method  string
	Command *ctrlv1.CommandMetadata
	// Input is the request as far as it decides the outcome.
	Input proto.Message
	// New returns an empty response, to unmarshal a replay into.
	New func() R
}

func invalid(err error) error { return connect.NewError(connect.CodeInvalidArgument, err) }

func (s *Service[S]) notFound(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s %q not found", s.Kind.Noun, id))
}

func (m Mutation[R]) command(c auth.Caller) command.Command[R] {
	return command.Command[R]{ProjectID: c.ProjectID, Method: m.Method, ID: m.Command.GetCommandId(), Input: m.Input, New: m.New}
}

// run validates the command ID, replays a repeated command before slow
// checks, then executes the command.
func run[S, R proto.Message](ctx context.Context, s *Service[S], m Mutation[R], slow func(context.Context) error,
	exec command.Execute[R]) (R, error) {
	var zero R
	cmd, err := CommandOf(ctx, m)
	if err != nil {
		return zero, err
	}
	if slow != nil {
		resp, found, err := command.Replay(ctx, s.Store, cmd)
		if err != nil || found {
			return resp, err
		}
		if err := slow(ctx); err != nil {
			return zero, invalid(err)
		}
	}
	resp, err := command.Run(ctx, s.Store, cmd, exec)
	if err == nil && s.Changed != nil {
		s.Changed()
	}
	return resp, err
}

// Create stores a new object at revision 1.
func Create[S, R proto.Message](ctx context.Context, s *Service[S], m Mutation[R], spec S,
	labels, annotations map[string]string, respond func(Object[S]) R) (R, error) {
	var zero R
	if err := s.Kind.Check(spec); err != nil {
		return zero, invalid(err)
	}
	if err := checkMaps(labels, annotations); err != nil {
		return zero, err
	}
	body, err := proto.Marshal(spec)
	if err != nil {
		return zero, err
	}
	return run(ctx, s, m, s.slow(spec), func(ctx context.Context, tx store.Tx) (R, error) {
		c, _ := auth.CallerFrom(ctx)
		now := s.now()
		o := store.Object{
			Kind: s.Kind.Store, ProjectID: c.ProjectID, ID: ids.New(s.Kind.IDPrefix),
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

func checkMaps(labels, annotations map[string]string) error {
	if err := meta.ValidateLabels(labels); err != nil {
		return invalid(err)
	}
	if err := meta.ValidateAnnotations(annotations); err != nil {
		return invalid(err)
	}
	return nil
}

// Get returns a live object.
func (s *Service[S]) Get(ctx context.Context, id string) (Object[S], error) {
	c, _ := auth.CallerFrom(ctx)
	var o Object[S]
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		o, err = s.load(ctx, tx, c.ProjectID, id)
		return err
	})
	return s.redacted(o), err
}

// load reads a live object of the caller's project; deleted, missing and
// other projects' objects are all not_found.
func (s *Service[S]) load(ctx context.Context, tx store.Tx, projectID, id string) (Object[S], error) {
	if id == "" {
		return Object[S]{}, invalid(fmt.Errorf("%s ID is required", s.Kind.Noun))
	}
	o, err := tx.Object(ctx, s.Kind.Store, projectID, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && o.Deleted() {
		return Object[S]{}, s.notFound(id)
	}
	if err != nil {
		return Object[S]{}, err
	}
	spec := s.Kind.NewSpec()
	if err := proto.Unmarshal(o.Spec, spec); err != nil {
		return Object[S]{}, fmt.Errorf("%s %s: stored spec: %w", s.Kind.Noun, id, err)
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
	objs, next, err := ListPage(ctx, s.Store, s.Pages, string(s.Kind.Store), pageSize, token, selector,
		func(ctx context.Context, tx store.Tx, q store.ObjectQuery) ([]store.Object, error) {
			q.Kind = s.Kind.Store
			return tx.Objects(ctx, q)
		},
		func(o store.Object) string { return o.ID },
		func(_ context.Context, _ store.Tx, o store.Object) (Object[S], error) {
			spec := s.Kind.NewSpec()
			if err := proto.Unmarshal(o.Spec, spec); err != nil {
				return Object[S]{}, fmt.Errorf("%s %s: stored spec: %w", s.Kind.Noun, o.ID, err)
			}
			return Object[S]{Object: o, Spec: s.Kind.Redact(spec)}, nil
		})
	return Page[S]{Objects: objs, Next: next}, err
}

// ListPage is the paging every List method shares. It checks page_size
// and the selector, resolves the page token of kind in the caller's
// project, and in one read transaction fetches the rows after it (one more
// than the page, to know whether another follows) and turns each row of
// the page into what the caller returns.
func ListPage[T, V any](ctx context.Context, st store.Store, pages *pagetoken.Codec, kind string, pageSize uint32, token string,
	selector map[string]string, fetch func(context.Context, store.Tx, store.ObjectQuery) ([]T, error),
	id func(T) string, view func(context.Context, store.Tx, T) (V, error)) ([]V, string, error) {
	c, _ := auth.CallerFrom(ctx)
	if pageSize > MaxPageSize {
		return nil, "", invalid(fmt.Errorf("page_size %d is above the maximum of %d", pageSize, MaxPageSize))
	}
	if pageSize == 0 {
		pageSize = DefaultPageSize
	}
	if err := meta.ValidateSelector(selector); err != nil {
		return nil, "", invalid(err)
	}
	scope := pagetoken.Scope{Kind: kind, ProjectID: c.ProjectID, Selector: selector}
	after := ""
	if token != "" {
		var err error
		if after, err = pages.Decode(scope, token); err != nil {
			return nil, "", invalid(err)
		}
	}
	var (
		out  []V
		next string
	)
	err := st.View(ctx, func(tx store.Tx) error {
		out, next = nil, ""
		rows, err := fetch(ctx, tx, store.ObjectQuery{ProjectID: c.ProjectID, After: after, Selector: selector, Limit: int(pageSize) + 1})
		if err != nil {
			return err
		}
		if len(rows) > int(pageSize) {
			rows = rows[:pageSize]
			next = pages.Encode(scope, id(rows[len(rows)-1]))
		}
		for _, row := range rows {
			v, err := view(ctx, tx, row)
			if err != nil {
				return err
			}
			out = append(out, v)
		}
		return nil
	})
	return out, next, err
}

// CommandOf checks a write's command_id and describes the write to the
// command layer, scoped to the caller's project.
func CommandOf[R proto.Message](ctx context.Context, m Mutation[R]) (command.Command[R], error) {
	c, ok := auth.CallerFrom(ctx)
	if !ok {
		return command.Command[R]{}, connect.NewError(connect.CodeUnauthenticated, auth.ErrUnauthenticated)
	}
	if err := command.ValidateID(m.Command.GetCommandId()); err != nil {
		return command.Command[R]{}, invalid(err)
	}
	return m.command(c), nil
}

// Edit runs the write m as the change of one stored resource: inside the
// command's transaction load reads it, change edits it, and save stores it
// when its encoding differs afterwards; view turns it into the response.
// changed reports whether anything was stored, for the caller to announce.
func Edit[T any, E any, V any, R proto.Message](ctx context.Context, st store.Store, m Mutation[R],
	load func(context.Context, store.Tx, string) (T, error), encode func(T) (E, error),
	change func(context.Context, store.Tx, T) error, save func(context.Context, store.Tx, T) error,
	view func(context.Context, store.Tx, T) (V, error), respond func(V) R) (resp R, changed bool, err error) {
	var zero R
	cmd, err := CommandOf(ctx, m)
	if err != nil {
		return zero, false, err
	}
	resp, err = command.Run(ctx, st, cmd, func(ctx context.Context, tx store.Tx) (R, error) {
		changed = false
		r, err := load(ctx, tx, cmd.ProjectID)
		if err != nil {
			return zero, err
		}
		before, err := encode(r)
		if err != nil {
			return zero, err
		}
		if err := change(ctx, tx, r); err != nil {
			return zero, err
		}
		after, err := encode(r)
		if err != nil {
			return zero, err
		}
		if changed = !reflect.DeepEqual(before, after); changed {
			if err := save(ctx, tx, r); err != nil {
				return zero, err
			}
		}
		v, err := view(ctx, tx, r)
		if err != nil {
			return zero, err
		}
		return respond(v), nil
	})
	return resp, changed && err == nil, err
}

// CheckMapWrite checks a labels or annotations replacement before it runs:
// the map against its rules, and that the caller sent the revision it
// observed (revisionName names it, as in expected_<revisionName>).
func CheckMapWrite(m map[string]string, validate func(map[string]string) error, revisionName string, expected uint64) error {
	if err := validate(m); err != nil {
		return invalid(err)
	}
	if expected == 0 {
		return invalid(fmt.Errorf("expected_%s is required: send the revision you observed", revisionName))
	}
	return nil
}

// ReplaceMap is the CAS replacement of labels or annotations: aborted
// unless *revision is expected; a different map replaces *current and
// increments *revision, an equal one changes nothing.
func ReplaceMap(current *map[string]string, revision *uint64, revisionName string, expected uint64, m map[string]string) error {
	if *revision != expected {
		return command.Aborted(revisionName, expected, *revision)
	}
	if !meta.Equal(*current, m) {
		*current = m
		*revision++
	}
	return nil
}

// DrainSeconds resolves an optional drain_seconds.
func DrainSeconds(v *uint32) (uint32, error) {
	if v == nil {
		return DefaultDrainSeconds, nil
	}
	if *v > MaxDrainSeconds {
		return 0, invalid(fmt.Errorf("drain_seconds %d is out of range: it must be 0 to %d", *v, MaxDrainSeconds))
	}
	return *v, nil
}

// Update replaces the spec under CAS on revision. Equal content keeps the
// revision; different content increments it and records drain as the
// drain of the replaced revision's connections.
func Update[S, R proto.Message](ctx context.Context, s *Service[S], m Mutation[R], id string, expected uint64,
	spec S, drain *uint32, respond func(Object[S]) R) (R, error) {
	var zero R
	if id == "" {
		return zero, invalid(fmt.Errorf("%s ID is required", s.Kind.Noun))
	}
	if expected == 0 {
		return zero, invalid(errors.New("expected_revision is required: send the revision you observed"))
	}
	if err := s.Kind.Check(spec); err != nil {
		return zero, invalid(err)
	}
	seconds, err := DrainSeconds(drain)
	if err != nil {
		return zero, err
	}
	body, err := proto.Marshal(spec)
	if err != nil {
		return zero, err
	}
	return run(ctx, s, m, s.slow(spec), func(ctx context.Context, tx store.Tx) (R, error) {
		c, _ := auth.CallerFrom(ctx)
		o, err := s.load(ctx, tx, c.ProjectID, id)
		if err != nil {
			return zero, err
		}
		if o.Revision != expected {
			return zero, command.Aborted("revision", expected, o.Revision)
		}
		if !proto.Equal(o.Spec, spec) {
			if s.Kind.CheckUpdate != nil {
				if err := s.Kind.CheckUpdate(ctx, tx, c.ProjectID, id, o.Spec, spec); err != nil {
					return zero, err
				}
			}
			o.Object.Spec, o.Spec = body, spec
			o.Revision++
			o.DrainSeconds = seconds
			o.UpdatedAt = s.now()
			if err := tx.UpdateObject(ctx, o.Object); err != nil {
				return zero, err
			}
		}
		return respond(s.redacted(o)), nil
	})
}

// Delete deletes an object no workspace policy references.
func Delete[S, R proto.Message](ctx context.Context, s *Service[S], m Mutation[R], id string, respond func() R) (R, error) {
	var zero R
	if id == "" {
		return zero, invalid(fmt.Errorf("%s ID is required", s.Kind.Noun))
	}
	return run(ctx, s, m, nil, func(ctx context.Context, tx store.Tx) (R, error) {
		c, _ := auth.CallerFrom(ctx)
		o, err := s.load(ctx, tx, c.ProjectID, id)
		if err != nil {
			return zero, err
		}
		ws, err := tx.ReferencingWorkspaces(ctx, c.ProjectID, store.PolicyReference{Kind: s.Kind.Referenced, TargetID: id}, 1)
		if err != nil {
			return zero, err
		}
		if len(ws) > 0 {
			return zero, s.Kind.InUse(ctx, tx, c.ProjectID, ws[0],
				"%s %q is referenced by the network policy of workspace %q; remove it from every policy first",
				s.Kind.Noun, id, ws[0])
		}
		o.DeletedAt = s.now()
		o.UpdatedAt = o.DeletedAt
		if err := tx.UpdateObject(ctx, o.Object); err != nil {
			return zero, err
		}
		return respond(), nil
	})
}

// UpdateLabels replaces the labels under CAS on labels_revision.
func UpdateLabels[S, R proto.Message](ctx context.Context, s *Service[S], m Mutation[R], id string, expected uint64,
	labels map[string]string, respond func(Object[S]) R) (R, error) {
	return updateMap(ctx, s, m, id, "labels_revision", expected, labels, meta.ValidateLabels, respond,
		func(o *store.Object) (*map[string]string, *uint64) { return &o.Labels, &o.LabelsRevision })
}

// UpdateAnnotations replaces the annotations under CAS on
// annotations_revision.
func UpdateAnnotations[S, R proto.Message](ctx context.Context, s *Service[S], m Mutation[R], id string, expected uint64,
	annotations map[string]string, respond func(Object[S]) R) (R, error) {
	return updateMap(ctx, s, m, id, "annotations_revision", expected, annotations, meta.ValidateAnnotations, respond,
		func(o *store.Object) (*map[string]string, *uint64) { return &o.Annotations, &o.AnnotationsRevision })
}

// updateMap is the CAS replacement shared by labels and annotations: field
// picks the map and its revision out of the object.
func updateMap[S, R proto.Message](ctx context.Context, s *Service[S], m Mutation[R], id, revisionName string, expected uint64,
	value map[string]string, validate func(map[string]string) error, respond func(Object[S]) R,
	field func(*store.Object) (*map[string]string, *uint64)) (R, error) {
	var zero R
	if id == "" {
		return zero, invalid(fmt.Errorf("%s ID is required", s.Kind.Noun))
	}
	if err := CheckMapWrite(value, validate, revisionName, expected); err != nil {
		return zero, err
	}
	return run(ctx, s, m, nil, func(ctx context.Context, tx store.Tx) (R, error) {
		c, _ := auth.CallerFrom(ctx)
		o, err := s.load(ctx, tx, c.ProjectID, id)
		if err != nil {
			return zero, err
		}
		current, revision := field(&o.Object)
		before := *revision
		if err := ReplaceMap(current, revision, revisionName, expected, value); err != nil {
			return zero, err
		}
		if *revision != before {
			o.UpdatedAt = s.now()
			if err := tx.UpdateObject(ctx, o.Object); err != nil {
				return zero, err
			}
		}
		return respond(s.redacted(o)), nil
	})
}

// NewMessage returns a new, empty message of type R.
func NewMessage[R proto.Message]() R {
	var zero R
	return zero.ProtoReflect().Type().New().Interface().(R)
}
