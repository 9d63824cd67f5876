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
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/objects"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
)

// newCommand validates the command ID and describes the command of c.
func newCommand[R proto.Message](c auth.Caller, method string, cmd *ctrlv1.CommandMetadata, input proto.Message) (command.Command[R], error) {
	if err := command.ValidateID(cmd.GetCommandId()); err != nil {
		return command.Command[R]{}, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return command.Command[R]{ProjectID: c.ProjectID, Method: method, ID: cmd.GetCommandId(), Input: input, New: objects.NewMessage[R]}, nil
}

// run executes a write whose whole request is the command's input.
func run[R proto.Message](ctx context.Context, s *Service, method string, cmd *ctrlv1.CommandMetadata, input proto.Message,
	exec func(ctx context.Context, tx store.Tx, c auth.Caller) (R, error)) (R, error) {
	var zero R
	c, err := caller(ctx)
	if err != nil {
		return zero, err
	}
	cm, err := newCommand[R](c, method, cmd, input)
	if err != nil {
		return zero, err
	}
	return command.Run(ctx, s.Store, cm, func(ctx context.Context, tx store.Tx) (R, error) { return exec(ctx, tx, c) })
}

// CreateTemplate stores a new Template at revision 1 without revisions.
func (s *Service) CreateTemplate(ctx context.Context, req *ctrlv1.CreateTemplateRequest) (*ctrlv1.CreateTemplateResponse, error) {
	id := req.GetTemplateId()
	if err := ValidateID(id); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err := meta.ValidateLabels(req.GetLabels()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err := meta.ValidateAnnotations(req.GetAnnotations()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return run(ctx, s, ctrlv1connect.TemplateServiceCreateTemplateProcedure, req.GetCommand(), req,
		func(ctx context.Context, tx store.Tx, c auth.Caller) (*ctrlv1.CreateTemplateResponse, error) {
			t, err := create(ctx, tx, c.ProjectID, id, req.GetLabels(), req.GetAnnotations(), s.now())
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
	if project != workspaces.BuiltinProject {
		b, err := tx.Object(ctx, store.KindTemplate, workspaces.BuiltinProject, id)
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
func (s *Service) GetTemplate(ctx context.Context, req *ctrlv1.GetTemplateRequest) (*ctrlv1.GetTemplateResponse, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	var resp *ctrlv1.GetTemplateResponse
	err = s.Store.View(ctx, func(tx store.Tx) error {
		t, err := lookup(ctx, tx, c, req.GetTemplateId(), false)
		if err != nil {
			return err
		}
		resp = &ctrlv1.GetTemplateResponse{Template: t.view()}
		return nil
	})
	return resp, err
}

// ListTemplates returns one page of the Templates the caller can read:
// its project's and the built-in ones, merged oldest first (by created_at,
// built-in first on a tie, then by ID). A page token names the position
// after the last Template of its page, so Templates created later appear
// on later pages and deleted ones simply drop out.
func (s *Service) ListTemplates(ctx context.Context, req *ctrlv1.ListTemplatesRequest) (*ctrlv1.ListTemplatesResponse, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	size := req.GetPageSize()
	if size > MaxPageSize {
		return nil, invalid("page_size %d is above the maximum of %d", size, MaxPageSize)
	}
	if size == 0 {
		size = DefaultPageSize
	}
	selector := req.GetLabelSelector()
	if err := meta.ValidateSelector(selector); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	scope := pagetoken.Scope{Kind: string(store.KindTemplate), ProjectID: c.ProjectID, Selector: selector}
	after := ""
	if tok := req.GetPageToken(); tok != "" {
		if after, err = s.Pages.Decode(scope, tok); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	resp := &ctrlv1.ListTemplatesResponse{}
	err = s.Store.View(ctx, func(tx store.Tx) error {
		resp.Templates, resp.NextPageToken = nil, ""
		var all []*tmpl
		for _, p := range []string{workspaces.BuiltinProject, c.ProjectID} {
			objs, err := allObjects(ctx, tx, p, selector)
			if err != nil {
				return err
			}
			for _, o := range objs {
				t, err := load(o)
				if err != nil {
					return err
				}
				all = append(all, t)
			}
		}
		slices.SortFunc(all, func(a, b *tmpl) int { return strings.Compare(a.position(), b.position()) })
		start := slices.IndexFunc(all, func(t *tmpl) bool { return t.position() > after })
		if start < 0 {
			start = len(all)
		}
		page := all[start:]
		if len(page) > int(size) {
			page = page[:size]
			resp.NextPageToken = s.Pages.Encode(scope, page[len(page)-1].position())
		}
		for _, t := range page {
			resp.Templates = append(resp.Templates, t.view())
		}
		return nil
	})
	return resp, err
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

// allObjects returns every live Template of a project matching selector.
func allObjects(ctx context.Context, tx store.Tx, project string, selector map[string]string) ([]store.Object, error) {
	var out []store.Object
	after := ""
	for {
		objs, err := tx.Objects(ctx, store.ObjectQuery{Kind: store.KindTemplate, ProjectID: project,
			After: after, Selector: selector, Limit: MaxPageSize})
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
		if len(objs) < MaxPageSize {
			return out, nil
		}
		after = objs[len(objs)-1].ID
	}
}

// SetTemplateDefault points the default at one of the Template's revisions
// under CAS on Template.revision.
func (s *Service) SetTemplateDefault(ctx context.Context, req *ctrlv1.SetTemplateDefaultRequest) (*ctrlv1.SetTemplateDefaultResponse, error) {
	id, rev, expected := req.GetTemplateId(), req.GetDefaultRevision(), req.GetExpectedRevision()
	if id == "" {
		return nil, invalid("template_id is required")
	}
	if expected == 0 {
		return nil, invalid("expected_revision is required: send the revision you observed")
	}
	if rev == "" {
		return nil, invalid("default_revision is required")
	}
	return run(ctx, s, ctrlv1connect.TemplateServiceSetTemplateDefaultProcedure, req.GetCommand(), req,
		func(ctx context.Context, tx store.Tx, c auth.Caller) (*ctrlv1.SetTemplateDefaultResponse, error) {
			t, err := lookup(ctx, tx, c, id, true)
			if err != nil {
				return nil, err
			}
			if t.obj.Revision != expected {
				return nil, command.Aborted("revision", expected, t.obj.Revision)
			}
			if _, ok := t.find(rev); !ok {
				return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("template %q has no revision %q", id, rev))
			}
			if t.spec.GetDefaultRevision() != rev {
				t.spec.DefaultRevision = rev
				t.obj.Revision++
				t.obj.UpdatedAt = s.now()
				if err := t.save(ctx, tx); err != nil {
					return nil, err
				}
			}
			return &ctrlv1.SetTemplateDefaultResponse{Template: t.view()}, nil
		})
}

// DeleteTemplate deletes a Template no live workspace uses.
func (s *Service) DeleteTemplate(ctx context.Context, req *ctrlv1.DeleteTemplateRequest) (*ctrlv1.DeleteTemplateResponse, error) {
	id := req.GetTemplateId()
	if id == "" {
		return nil, invalid("template_id is required")
	}
	return run(ctx, s, ctrlv1connect.TemplateServiceDeleteTemplateProcedure, req.GetCommand(), req,
		func(ctx context.Context, tx store.Tx, c auth.Caller) (*ctrlv1.DeleteTemplateResponse, error) {
			t, err := lookup(ctx, tx, c, id, true)
			if err != nil {
				return nil, err
			}
			project, ws, err := user(ctx, tx, t)
			if err != nil {
				return nil, err
			}
			if ws != "" {
				return nil, inUse(ctx, tx, c, id, project, ws)
			}
			t.obj.DeletedAt = s.now()
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
func inUse(ctx context.Context, tx store.Tx, c auth.Caller, id, project, workspace string) error {
	if project != c.ProjectID {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"template %q is used by a workspace of another project; delete its workspaces first", id))
	}
	return workspaces.InUse(ctx, tx, project, workspace,
		"template %q is used by workspace %q; delete the workspaces created from it first", id, workspace)
}

// UpdateTemplateLabels replaces the labels under CAS on labels_revision.
func (s *Service) UpdateTemplateLabels(ctx context.Context, req *ctrlv1.UpdateTemplateLabelsRequest) (*ctrlv1.UpdateTemplateLabelsResponse, error) {
	labels := req.GetLabels()
	if err := meta.ValidateLabels(labels); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return updateMap(ctx, s, ctrlv1connect.TemplateServiceUpdateTemplateLabelsProcedure, req.GetCommand(), req,
		req.GetTemplateId(), "labels_revision", req.GetExpectedLabelsRevision(),
		func(o *store.Object) *uint64 {
			if meta.Equal(o.Labels, labels) {
				return nil
			}
			o.Labels = labels
			return &o.LabelsRevision
		}, func(o store.Object) uint64 { return o.LabelsRevision },
		func(t *ctrlv1.Template) *ctrlv1.UpdateTemplateLabelsResponse {
			return &ctrlv1.UpdateTemplateLabelsResponse{Template: t}
		})
}

// UpdateTemplateAnnotations replaces the annotations under CAS on
// annotations_revision.
func (s *Service) UpdateTemplateAnnotations(ctx context.Context, req *ctrlv1.UpdateTemplateAnnotationsRequest) (*ctrlv1.UpdateTemplateAnnotationsResponse, error) {
	annotations := req.GetAnnotations()
	if err := meta.ValidateAnnotations(annotations); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return updateMap(ctx, s, ctrlv1connect.TemplateServiceUpdateTemplateAnnotationsProcedure, req.GetCommand(), req,
		req.GetTemplateId(), "annotations_revision", req.GetExpectedAnnotationsRevision(),
		func(o *store.Object) *uint64 {
			if meta.Equal(o.Annotations, annotations) {
				return nil
			}
			o.Annotations = annotations
			return &o.AnnotationsRevision
		}, func(o store.Object) uint64 { return o.AnnotationsRevision },
		func(t *ctrlv1.Template) *ctrlv1.UpdateTemplateAnnotationsResponse {
			return &ctrlv1.UpdateTemplateAnnotationsResponse{Template: t}
		})
}

// updateMap is the CAS replacement shared by labels and annotations: apply
// sets the new map and returns the revision to increment, or nil when the
// content is equal.
func updateMap[R proto.Message](ctx context.Context, s *Service, method string, cmd *ctrlv1.CommandMetadata, input proto.Message,
	id, field string, expected uint64, apply func(*store.Object) *uint64, current func(store.Object) uint64,
	respond func(*ctrlv1.Template) R) (R, error) {
	var zero R
	if id == "" {
		return zero, invalid("template_id is required")
	}
	if expected == 0 {
		return zero, invalid("expected_%s is required: send the revision you observed", field)
	}
	return run(ctx, s, method, cmd, input, func(ctx context.Context, tx store.Tx, c auth.Caller) (R, error) {
		t, err := lookup(ctx, tx, c, id, true)
		if err != nil {
			return zero, err
		}
		if rev := current(t.obj); rev != expected {
			return zero, command.Aborted(field, expected, rev)
		}
		if rev := apply(&t.obj); rev != nil {
			*rev++
			t.obj.UpdatedAt = s.now()
			if err := tx.UpdateObject(ctx, t.obj); err != nil {
				return zero, err
			}
		}
		return respond(t.view()), nil
	})
}
