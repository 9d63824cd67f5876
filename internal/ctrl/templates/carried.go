package templates

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// SourceTransfer is the source of a revision imported from a transfer
// artifact, followed by the Transfer's ID.
const SourceTransfer = "transfer:"

// ImportCarried imports the image of the OCI image layout dir, which a
// transfer artifact carried, as a revision of a Template of projectID,
// through the same steps as ImportTemplateRevision: the image store
// verifies every blob, and the revision is added to the Template (made
// its default only when it has none). The Template is the project's
// templateID, created when the project has none; when templateID is a
// built-in Template's, it is templateID-<the first 12 hex digits of the
// image digest> instead, since nothing but an operator changes a built-in
// one. The image must be digest (sha256:<hex>), else invalid_argument.
func (s *Service) ImportCarried(ctx context.Context, projectID, templateID, digest, dir, source string) (*ctrlv1.TemplateRef, error) {
	img, err := s.Images.ImportLayoutDir(ctx, dir)
	if err != nil {
		return nil, importError(ctx, err, connect.CodeInvalidArgument)
	}
	if img.ManifestDigest != digest {
		return nil, invalid("the carried template image is %s, not the %s the manifest names", img.ManifestDigest, digest)
	}
	rev, err := describe(ctx, s.Images, img, source)
	if err != nil {
		return nil, err
	}
	if err := s.Shared.Share(ctx, img); err != nil {
		return nil, importError(ctx, err, connect.CodeUnavailable)
	}
	var ref *ctrlv1.TemplateRef
	err = s.Store.Update(ctx, func(tx store.Tx) error {
		id, err := carriedID(ctx, tx, templateID, digest)
		if err != nil {
			return err
		}
		var t *tmpl
		o, err := tx.Object(ctx, store.KindTemplate, projectID, id)
		switch {
		case err == nil && !o.Deleted():
			t, err = load(o)
		case err == nil || errors.Is(err, store.ErrNotFound):
			t, err = create(ctx, tx, projectID, id, nil, nil, s.Now.UTC())
		}
		if err != nil {
			return err
		}
		r, err := addRevision(ctx, tx, t, img, rev, false, s.Now.UTC())
		if err != nil {
			return err
		}
		ref = &ctrlv1.TemplateRef{TemplateId: id, Revision: r.GetRevision()}
		return nil
	})
	return ref, err
}

// carriedID is the ID of the Template a carried image of templateID goes
// to.
func carriedID(ctx context.Context, tx store.Tx, templateID, digest string) (string, error) {
	id := templateID
	b, err := tx.Object(ctx, store.KindTemplate, BuiltinProject, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	if err == nil && !b.Deleted() {
		hexDigest := strings.TrimPrefix(digest, "sha256:")
		id = strings.TrimRight(id[:min(len(id), 50)], "-") + "-" + hexDigest[:min(len(hexDigest), 12)]
	}
	if err := ValidateID(id); err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the carried template's ID: %w", err))
	}
	return id, nil
}
