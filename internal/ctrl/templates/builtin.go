package templates

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// BuiltinID is the ID of the built-in template EnsureBuiltin keeps.
const BuiltinID = DefaultTemplate

// EnsureBuiltin makes sure the built-in template base exists in project
// BuiltinProject and holds the image imagestore.BuiltinImage
// builds from the busybox at busyboxPath (source "builtin"). A new base
// gets that image as its first, default revision. When base already has
// the image nothing changes, whatever its default (an operator may have
// chosen another); when the image is new (busybox changed), it is added
// and becomes the default. A deleted base is created again.
//
// It runs at every start of the control plane, before it serves.
func EnsureBuiltin(ctx context.Context, st store.Store, images *imagestore.Store, busyboxPath string) error {
	src, err := imagestore.BuiltinImage(busyboxPath)
	if err != nil {
		return err
	}
	img, err := images.ImportImage(ctx, src)
	if err != nil {
		return fmt.Errorf("built-in template %s: %w", BuiltinID, err)
	}
	rev, err := describe(ctx, images, img, SourceBuiltin)
	if err != nil {
		return fmt.Errorf("built-in template %s: %w", BuiltinID, err)
	}
	operator := auth.Caller{ProjectID: BuiltinProject, Role: auth.Admin, Operator: true}
	err = st.Update(ctx, func(tx store.Tx) error {
		now := time.Now().UTC()
		t, err := lookup(ctx, tx, operator, BuiltinID, true)
		if connect.CodeOf(err) == connect.CodeNotFound {
			t, err = create(ctx, tx, BuiltinProject, BuiltinID, nil, nil, now)
		}
		if err != nil {
			return err
		}
		_, has := t.find(rev.GetRevision())
		_, err = addRevision(ctx, tx, t, img, rev, !has, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("built-in template %s: %w", BuiltinID, err)
	}
	return nil
}
