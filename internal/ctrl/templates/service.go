package templates

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Write describes a write request.
type Write[R proto.Message] = resource.Mutation[R]

// CreateTemplate stores a new Template at revision 1 without revisions.
func (s *Service) CreateTemplate(ctx context.Context, w Write[*ctrlv1.CreateTemplateResponse], id string,
	labels, annotations map[string]string) (*ctrlv1.CreateTemplateResponse, error) {
	if err := ValidateID(id); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err := resource.CheckMaps(labels, annotations); err != nil {
		return nil, err
	}
	return resource.Run(ctx, s.Store, w, func(ctx context.Context, tx store.Tx, projectID string) (*ctrlv1.CreateTemplateResponse, error) {
		t, err := create(ctx, tx, projectID, id, labels, annotations, s.Now.UTC())
		if err != nil {
			return nil, err
		}
		return &ctrlv1.CreateTemplateResponse{Template: t.view()}, nil
	})
}

// create stores a new, empty Template in project, reviving the tombstone
// of a deleted one with the same ID.
func create(ctx context.Context, tx store.Tx, project, id string, labels, annotations map[string]string, now time.Time) (*tmpl, error) {
	exists := connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("template %q already exists", id))
	if project != BuiltinProject {
		b, err := tx.Object(ctx, store.KindTemplate, BuiltinProject, id)
		if err == nil && !b.Deleted() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("template %q already exists as a built-in template", id))
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	old, err := tx.Object(ctx, store.KindTemplate, project, id)
	revive := err == nil
	switch {
	case revive && !old.Deleted():
		return nil, exists
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	t := &tmpl{
		obj: store.Object{
			Kind: store.KindTemplate, ProjectID: project, ID: id, Revision: 1,
			Labels: labels, LabelsRevision: 1, Annotations: annotations, AnnotationsRevision: 1,
			CreatedAt: now, UpdatedAt: now,
		},
		spec: &ctrlv1.Template{},
	}
	if revive {
		// The store keeps the first incarnation's created_at.
		t.spec.CreatedAt = timestamppb.New(now)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(t.spec)
	if err != nil {
		return nil, err
	}
	t.obj.Spec = body
	if revive {
		err = tx.UpdateObject(ctx, t.obj)
	} else {
		err = tx.CreateObject(ctx, t.obj)
	}
	return t, err
}

// GetTemplate returns one Template with its revisions.
func (s *Service) GetTemplate(ctx context.Context, id string) (*ctrlv1.Template, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	var out *ctrlv1.Template
	err = s.Store.View(ctx, func(tx store.Tx) error {
		t, err := lookup(ctx, tx, c, id, false)
		if err == nil {
			out = t.view()
		}
		return err
	})
	return out, err
}

// ListTemplates returns one page of the Templates the caller can read:
// its project's and the built-in ones, merged oldest first (by created_at,
// built-in first on a tie, then by ID). A page token names the position
// after the last Template of its page, so Templates created later appear
// on later pages and deleted ones simply drop out.
func (s *Service) ListTemplates(ctx context.Context, pageSize uint32, token string, selector map[string]string) ([]*ctrlv1.Template, string, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, "", err
	}
	p, err := resource.ParsePage(ctx, s.Pages, string(store.KindTemplate), pageSize, token, selector)
	if err != nil {
		return nil, "", err
	}
	var (
		out  []*ctrlv1.Template
		next string
	)
	err = s.Store.View(ctx, func(tx store.Tx) error {
		out = nil
		all, err := allTemplates(ctx, tx, []string{BuiltinProject, c.ProjectID}, selector)
		if err != nil {
			return err
		}
		slices.SortFunc(all, func(a, b *tmpl) int { return strings.Compare(a.position(), b.position()) })
		start := slices.IndexFunc(all, func(t *tmpl) bool { return t.position() > p.After })
		if start < 0 {
			start = len(all)
		}
		var page []*tmpl
		page, next = resource.Cut(p, all[start:], (*tmpl).position, (*tmpl).size)
		for _, t := range page {
			out = append(out, t.view())
		}
		return nil
	})
	return out, next, err
}

// size is a Template's bytes, as a page of ListTemplates counts them.
func (t *tmpl) size() int {
	return len(t.obj.Spec) + meta.Bytes(t.obj.Labels) + meta.Bytes(t.obj.Annotations)
}

// position is a Template's place in the order of ListTemplates, as a
// string that sorts in that order.
func (t *tmpl) position() string {
	kind := "1"
	if t.builtin() {
		kind = "0"
	}
	// Flipping the sign bit makes the decimal form sort as the time does.
	return fmt.Sprintf("%020d/%s/%s", uint64(t.createdAt().UnixNano())^(1<<63), kind, t.obj.ID)
}

// allTemplates returns every live Template of the projects matching
// selector.
func allTemplates(ctx context.Context, tx store.Tx, projects []string, selector map[string]string) ([]*tmpl, error) {
	var out []*tmpl
	for _, project := range projects {
		after := ""
		for {
			objs, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindTemplate, ProjectID: project,
				After: after, Selector: selector, Limit: resource.MaxPageSize})
			if err != nil {
				return nil, err
			}
			for _, o := range objs {
				t, err := load(o)
				if err != nil {
					return nil, err
				}
				out = append(out, t)
			}
			if len(objs) < resource.MaxPageSize {
				break
			}
			after = objs[len(objs)-1].ID
		}
	}
	return out, nil
}

// SetTemplateDefault points the default at one of the Template's revisions
// under CAS on Template.revision.
func (s *Service) SetTemplateDefault(ctx context.Context, w Write[*ctrlv1.SetTemplateDefaultResponse], id string, expected uint64,
	rev string) (*ctrlv1.SetTemplateDefaultResponse, error) {
	if id == "" {
		return nil, invalid("template_id is required")
	}
	if expected == 0 {
		return nil, invalid("expected_revision is required: send the revision you observed")
	}
	if rev == "" {
		return nil, invalid("default_revision is required")
	}
	return edit(ctx, s, w, id, func(t *tmpl) error {
		if t.obj.Revision != expected {
			return command.Aborted("revision", expected, t.obj.Revision)
		}
		if _, ok := t.find(rev); !ok {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("template %q has no revision %q", id, rev))
		}
		if t.spec.GetDefaultRevision() != rev {
			t.spec.DefaultRevision = rev
			t.obj.Revision++
		}
		return nil
	}, func(t *ctrlv1.Template) *ctrlv1.SetTemplateDefaultResponse {
		return &ctrlv1.SetTemplateDefaultResponse{Template: t}
	})
}

// DeleteTemplate deletes a Template no live workspace uses.
func (s *Service) DeleteTemplate(ctx context.Context, w Write[*ctrlv1.DeleteTemplateResponse], id string) (*ctrlv1.DeleteTemplateResponse, error) {
	if id == "" {
		return nil, invalid("template_id is required")
	}
	return resource.Run(ctx, s.Store, w,
		func(ctx context.Context, tx store.Tx, projectID string) (*ctrlv1.DeleteTemplateResponse, error) {
			c, _ := auth.CallerFrom(ctx)
			t, err := lookup(ctx, tx, c, id, true)
			if err != nil {
				return nil, err
			}
			project, ws, err := user(ctx, tx, t)
			if err != nil {
				return nil, err
			}
			if ws != "" {
				return nil, s.inUse(ctx, tx, c, id, project, ws)
			}
			t.obj.DeletedAt = s.Now.UTC()
			t.obj.UpdatedAt = t.obj.DeletedAt
			if err := tx.UpdateObject(ctx, t.obj); err != nil {
				return nil, err
			}
			return &ctrlv1.DeleteTemplateResponse{}, nil
		})
}

// user returns a live workspace created from t, and its project, or "".
// A built-in Template's users are in every project that has no Template
// of its own with that ID.
func user(ctx context.Context, tx store.Tx, t *tmpl) (project, workspace string, err error) {
	projects := []string{t.obj.ProjectID}
	if t.builtin() {
		all, err := tx.Projects(ctx)
		if err != nil {
			return "", "", err
		}
		projects = projects[:0]
		for _, p := range all {
			own, err := tx.Object(ctx, store.KindTemplate, p.ID, t.obj.ID)
			if err == nil && !own.Deleted() {
				continue
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return "", "", err
			}
			projects = append(projects, p.ID)
		}
	}
	for _, p := range projects {
		ws, err := tx.TemplateUsers(ctx, p, t.obj.ID, 1)
		if err != nil {
			return "", "", err
		}
		if len(ws) > 0 {
			return p, ws[0], nil
		}
	}
	return "", "", nil
}

// inUse is the failed_precondition of deleting a Template a workspace
// uses, with the workspace attached when it is the caller's.
func (s *Service) inUse(ctx context.Context, tx store.Tx, c auth.Caller, id, project, workspace string) error {
	if project != c.ProjectID {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"template %q is used by a workspace of another project; delete its workspaces first", id))
	}
	const format = "template %q is used by workspace %q; delete the workspaces created from it first"
	if s.InUse == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, id, workspace))
	}
	return s.InUse(ctx, tx, project, workspace, format, id, workspace)
}

// UpdateMap replaces the labels or the annotations (field) under CAS on
// their revision.
func UpdateMap[R proto.Message](ctx context.Context, s *Service, w Write[R], field resource.MapField, id string, expected uint64,
	m map[string]string, respond func(*ctrlv1.Template) R) (R, error) {
	var zero R
	if id == "" {
		return zero, invalid("template_id is required")
	}
	if err := field.CheckMapWrite(m, expected); err != nil {
		return zero, err
	}
	return edit(ctx, s, w, id, func(t *tmpl) error {
		current, revision := field.Select(&t.obj.Labels, &t.obj.LabelsRevision, &t.obj.Annotations, &t.obj.AnnotationsRevision)
		return field.Replace(current, revision, expected, m)
	}, respond)
}

// edit runs the write w as the change of the Template id: change edits it,
// and a changed Template is stored, stamped with updated_at.
func edit[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, change func(*tmpl) error,
	respond func(*ctrlv1.Template) R) (R, error) {
	resp, _, err := resource.Edit(ctx, s.Store, w,
		func(ctx context.Context, tx store.Tx, _ string) (*tmpl, error) {
			c, _ := auth.CallerFrom(ctx)
			return lookup(ctx, tx, c, id, true)
		},
		(*tmpl).encode,
		func(_ context.Context, _ store.Tx, t *tmpl) error { return change(t) },
		func(ctx context.Context, tx store.Tx, t *tmpl) error {
			t.obj.UpdatedAt = s.Now.UTC()
			return t.save(ctx, tx)
		},
		func(_ context.Context, _ store.Tx, t *tmpl) (*ctrlv1.Template, error) { return t.view(), nil },
		respond)
	return resp, err
}
