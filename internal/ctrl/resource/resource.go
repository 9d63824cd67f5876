// Package resource holds, once, the mechanics every ctrl resource service
// shares: describing a write to the command layer (Mutation, CommandOf,
// Run), reading and storing one resource (Load, Read, Decoded, Save) and
// its stored body (EncodeBody, DecodeBody), the CAS edit of one stored
// resource (Edit, EditID), the checks and CAS replacement of labels and
// annotations (CheckMaps, CheckMapWrite, ReplaceMap), and list pages
// (ParsePage, ListPage).
//
// Every error this package returns is a *connect.Error with its canonical
// code, or an internal error that the server reports as such.
package resource

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
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Page sizes of every List method.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Drain seconds of a change that replaces what live connections use: 0 to
// MaxDrainSeconds, absent = DefaultDrainSeconds.
const (
	DefaultDrainSeconds = 600
	MaxDrainSeconds     = 3600
)

// Clock is a service's clock; nil is time.Now.
type Clock func() time.Time

// UTC returns the time now, in UTC.
func (c Clock) UTC() time.Time {
	if c != nil {
		return c().UTC()
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

// NewMessage returns a new, empty message of type R.
func NewMessage[R proto.Message]() R {
	var zero R
	return zero.ProtoReflect().Type().New().Interface().(R)
}

// Invalid is invalid_argument with a formatted message.
func Invalid(format string, a ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, a...))
}

func invalid(err error) error { return connect.NewError(connect.CodeInvalidArgument, err) }

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
	return command.Command[R]{ProjectID: c.ProjectID, Method: m.Method, ID: m.Command.GetCommandId(), Input: m.Input, New: m.New}, nil
}

// Run runs the write m as one command: exec changes the store inside the
// command's transaction, with the caller's project.
func Run[R proto.Message](ctx context.Context, st store.Store, m Mutation[R],
	exec func(ctx context.Context, tx store.Tx, projectID string) (R, error)) (R, error) {
	cmd, err := CommandOf(ctx, m)
	if err != nil {
		var zero R
		return zero, err
	}
	return command.Run(ctx, st, cmd, func(ctx context.Context, tx store.Tx) (R, error) { return exec(ctx, tx, cmd.ProjectID) })
}

// Get reads the row of one resource of the project with get, such as
// tx.Volume; a missing row is not_found naming the kind and the ID.
func Get[Row any](ctx context.Context, get func(ctx context.Context, projectID, id string) (Row, error), kind, projectID, id string) (Row, error) {
	row, err := get(ctx, projectID, id)
	if errors.Is(err, store.ErrNotFound) {
		err = connect.NewError(connect.CodeNotFound, fmt.Errorf("%s %q not found", kind, id))
	}
	return row, err
}

// Load reads the row of one resource like Get and decodes it.
func Load[Row, R any](ctx context.Context, get func(ctx context.Context, projectID, id string) (Row, error),
	decode func(Row) (R, error), kind, projectID, id string) (R, error) {
	row, err := Get(ctx, get, kind, projectID, id)
	if err != nil {
		var zero R
		return zero, err
	}
	return decode(row)
}

// Viewer turns a decoded resource into what callers read.
type Viewer[T, V any] func(ctx context.Context, tx store.Tx, r T) (V, error)

// Read returns one resource of the caller's project as callers read it,
// in a read-only transaction: load reads it and view presents it. An empty
// id is invalid_argument naming its field, such as "volume_id". The store
// may serve the read from memory (store.Store.ViewCached) and then run
// load and view twice: they return what they read and keep nothing.
func Read[T, V any](ctx context.Context, st store.Store, field, id string,
	load func(ctx context.Context, tx store.Tx, projectID, id string) (T, error), view Viewer[T, V]) (V, error) {
	var v V
	if id == "" {
		return v, Invalid("%s is required", field)
	}
	c, _ := auth.CallerFrom(ctx)
	err := st.ViewCached(ctx, func(tx store.Tx) error {
		r, err := load(ctx, tx, c.ProjectID, id)
		if err == nil {
			v, err = view(ctx, tx, r)
		}
		return err
	})
	return v, err
}

// Decoded presents a stored row, as ListPage takes it: decode reads the
// row and view presents the result.
func Decoded[Row, T, V any](decode func(Row) (T, error), view Viewer[T, V]) func(context.Context, store.Tx, Row) (V, error) {
	return func(ctx context.Context, tx store.Tx, row Row) (V, error) {
		r, err := decode(row)
		if err != nil {
			var zero V
			return zero, err
		}
		return view(ctx, tx, r)
	}
}

// Save encodes a record with encode, stores the row with update, such as
// tx.UpdateVolume, and then keeps it in *row, the record's own, so that a
// later change in the same transaction builds on what is stored.
func Save[Row any](ctx context.Context, encode func() (Row, error), update func(context.Context, Row) error, row *Row) error {
	encoded, err := encode()
	if err != nil {
		return err
	}
	if err := update(ctx, encoded); err != nil {
		return err
	}
	*row = encoded
	return nil
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
	resp, err = Run(ctx, st, m, func(ctx context.Context, tx store.Tx, projectID string) (R, error) {
		changed = false
		r, err := load(ctx, tx, projectID)
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

// EditID is Edit of the resource id, which load reads from the caller's
// project; an empty id is invalid_argument naming its field, such as
// "volume_id".
func EditID[T any, E any, V any, R proto.Message](ctx context.Context, st store.Store, m Mutation[R], field, id string,
	load func(ctx context.Context, tx store.Tx, projectID, id string) (T, error), encode func(T) (E, error),
	change func(context.Context, store.Tx, T) error, save func(context.Context, store.Tx, T) error,
	view Viewer[T, V], respond func(V) R) (resp R, changed bool, err error) {
	if id == "" {
		return resp, false, Invalid("%s is required", field)
	}
	return Edit(ctx, st, m, func(ctx context.Context, tx store.Tx, projectID string) (T, error) {
		return load(ctx, tx, projectID, id)
	}, encode, change, save, view, respond)
}

// CheckMaps checks the labels and annotations a resource is created with.
func CheckMaps(labels, annotations map[string]string) error {
	if err := meta.ValidateLabels(labels); err != nil {
		return invalid(err)
	}
	if err := meta.ValidateAnnotations(annotations); err != nil {
		return invalid(err)
	}
	return nil
}

// MapField names one of the two maps every resource carries, with the
// rules its content follows.
type MapField struct {
	// Revision names the map's revision, as in expected_<Revision>.
	Revision string
	Validate func(map[string]string) error
	labels   bool
}

// The two maps of every resource.
var (
	Labels      = MapField{Revision: "labels_revision", Validate: meta.ValidateLabels, labels: true}
	Annotations = MapField{Revision: "annotations_revision", Validate: meta.ValidateAnnotations}
)

// CheckMapWrite checks a labels or annotations replacement before it runs:
// the map against its rules, and that the caller sent the revision it
// observed.
func (f MapField) CheckMapWrite(m map[string]string, expected uint64) error {
	if err := f.Validate(m); err != nil {
		return invalid(err)
	}
	if expected == 0 {
		return Invalid("expected_%s is required: send the revision you observed", f.Revision)
	}
	return nil
}

// Replace is the CAS replacement of labels or annotations: aborted unless
// *revision is expected; a different map replaces *current and increments
// *revision, an equal one changes nothing.
func (f MapField) Replace(current *map[string]string, revision *uint64, expected uint64, m map[string]string) error {
	if *revision != expected {
		return command.Aborted(f.Revision, expected, *revision)
	}
	if !meta.Equal(*current, m) {
		*current = m
		*revision++
	}
	return nil
}

// Select returns the field's map and revision among a resource's two.
func (f MapField) Select(labels *map[string]string, labelsRevision *uint64,
	annotations *map[string]string, annotationsRevision *uint64) (*map[string]string, *uint64) {
	if f.labels {
		return labels, labelsRevision
	}
	return annotations, annotationsRevision
}

// DrainSeconds resolves an optional drain_seconds.
func DrainSeconds(v *uint32) (uint32, error) {
	if v == nil {
		return DefaultDrainSeconds, nil
	}
	if *v > MaxDrainSeconds {
		return 0, Invalid("drain_seconds %d is out of range: it must be 0 to %d", *v, MaxDrainSeconds)
	}
	return *v, nil
}

// PageRequest is a checked List request: its size, the position after
// which the page starts, and what its next token is scoped to.
type PageRequest struct {
	Size  int
	After string
	scope pagetoken.Scope
	pages *pagetoken.Codec
}

// ParsePage checks page_size and the selector and resolves the page token
// of kind in the caller's project.
func ParsePage(ctx context.Context, pages *pagetoken.Codec, kind string, pageSize uint32, token string, selector map[string]string) (PageRequest, error) {
	c, _ := auth.CallerFrom(ctx)
	if pageSize > MaxPageSize {
		return PageRequest{}, Invalid("page_size %d is above the maximum of %d", pageSize, MaxPageSize)
	}
	if pageSize == 0 {
		pageSize = DefaultPageSize
	}
	if err := meta.ValidateSelector(selector); err != nil {
		return PageRequest{}, invalid(err)
	}
	p := PageRequest{Size: int(pageSize), scope: pagetoken.Scope{Kind: kind, ProjectID: c.ProjectID, Selector: selector}, pages: pages}
	if token != "" {
		var err error
		if p.After, err = pages.Decode(p.scope, token); err != nil {
			return PageRequest{}, invalid(err)
		}
	}
	return p, nil
}

// Cut trims rows (fetched in order after p.After, at least one more than
// the page when another page follows) to the page: p.Size rows, or fewer
// once they hold PageBytes (size tells a row's bytes). It returns the
// token of the next page, named by position, or "".
func Cut[T any](p PageRequest, rows []T, position func(T) string, size func(T) int) ([]T, string) {
	n, bytes := 0, 0
	for n < len(rows) && n < p.Size && (n == 0 || bytes < PageBytes) {
		bytes += size(rows[n])
		n++
	}
	if n == len(rows) {
		return rows, ""
	}
	return rows[:n], p.pages.Encode(p.scope, position(rows[n-1]))
}

// PageBytes bounds a List page: its rows' bytes (size) past it, the page
// ends there with a next page token, however many rows page_size asked
// for. A page holds at least one row. A page of 1,000 Egresses with 256 KiB
// of annotations each would otherwise be 256 MB to read and send.
const PageBytes = 4 << 20

// pageBatch is how many rows ListPage reads at a time, so that a page
// PageBytes cuts short was not read whole first.
const pageBatch = 64

// ListPage is the paging every List method of rows ordered by ID shares:
// ParsePage, then in one read transaction it fetches the rows after the
// token, pageBatch at a time (each time one more, to know whether
// another follows), and turns each row of the page into what the caller
// returns, until the page has its size or PageBytes of rows. fetch is a
// method expression of store.Tx, such as store.Tx.Volumes; size tells a
// row's bytes.
func ListPage[T, V any](ctx context.Context, st store.Store, pages *pagetoken.Codec, kind string, pageSize uint32, token string,
	selector map[string]string, fetch func(store.Tx, context.Context, store.ObjectQuery) ([]T, error),
	id func(T) string, size func(T) int, view func(context.Context, store.Tx, T) (V, error)) ([]V, string, error) {
	p, err := ParsePage(ctx, pages, kind, pageSize, token, selector)
	if err != nil {
		return nil, "", err
	}
	c, _ := auth.CallerFrom(ctx)
	var (
		out  []V
		next string
	)
	err = st.View(ctx, func(tx store.Tx) error {
		out, next = nil, ""
		after, bytes := p.After, 0
		for {
			n := min(p.Size-len(out), pageBatch)
			rows, err := fetch(tx, ctx, store.ObjectQuery{ProjectID: c.ProjectID, After: after, Selector: selector, Limit: n + 1})
			if err != nil {
				return err
			}
			for i, row := range rows[:min(n, len(rows))] {
				v, err := view(ctx, tx, row)
				if err != nil {
					return err
				}
				out = append(out, v)
				after, bytes = id(row), bytes+size(row)
				if bytes >= PageBytes && i < len(rows)-1 {
					next = p.pages.Encode(p.scope, after)
					return nil
				}
			}
			if len(rows) <= n {
				return nil // no row follows
			}
			if len(out) == p.Size {
				next = p.pages.Encode(p.scope, after)
				return nil
			}
		}
	})
	return out, next, err
}

// ByID indexes rows by their ID.
func ByID[T any](rows []T, id func(T) string) map[string]T {
	m := make(map[string]T, len(rows))
	for _, row := range rows {
		m[id(row)] = row
	}
	return m
}
