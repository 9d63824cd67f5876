package templates

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// BuiltinID is the ID of the built-in template EnsureBuiltin keeps.
const BuiltinID = DefaultTemplate

// DesktopID is the ID of the built-in template EnsureDesktop keeps: a
// Debian desktop that carries a display.
const DesktopID = "desktop"

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
	return ensureBuiltin(ctx, st, images, BuiltinID, src)
}

// EnsureDesktop does for the built-in template desktop what EnsureBuiltin
// does for base, with the desktop image built in cacheDir
// (imagestore.BuildDesktopImage); an error satisfying
// errors.Is(err, os.ErrNotExist) when none is built there.
func EnsureDesktop(ctx context.Context, st store.Store, images *imagestore.Store, cacheDir string) error {
	src, err := imagestore.DesktopImage(cacheDir)
	if err != nil {
		return err
	}
	return ensureBuiltin(ctx, st, images, DesktopID, src)
}

// ensureBuiltin makes sure the built-in template id holds src, as
// EnsureBuiltin describes. An image the template already lists and the
// image store still holds in full is not read again.
func ensureBuiltin(ctx context.Context, st store.Store, images *imagestore.Store, id string, src v1.Image) error {
	operator := auth.Caller{ProjectID: BuiltinProject, Role: auth.Admin, Operator: true}
	if held, err := holds(ctx, st, images, operator, id, src); err != nil || held {
		return err
	}
	img, err := images.ImportImage(ctx, src)
	if err != nil {
		return fmt.Errorf("built-in template %s: %w", id, err)
	}
	rev, err := describe(ctx, images, img, SourceBuiltin)
	if err != nil {
		return fmt.Errorf("built-in template %s: %w", id, err)
	}
	err = st.Update(ctx, func(tx store.Tx) error {
		now := time.Now().UTC()
		t, err := lookup(ctx, tx, operator, id, true)
		if connect.CodeOf(err) == connect.CodeNotFound {
			t, err = create(ctx, tx, BuiltinProject, id, nil, nil, now)
		}
		if err != nil {
			return err
		}
		_, has := t.find(rev.GetRevision())
		_, err = addRevision(ctx, tx, t, img, rev, !has, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("built-in template %s: %w", id, err)
	}
	return nil
}

// holds reports whether the built-in template id lists src's revision and
// the image store holds every blob of it: importing src again would change
// nothing.
func holds(ctx context.Context, st store.Store, images *imagestore.Store, operator auth.Caller, id string, src v1.Image) (bool, error) {
	digest, err := src.Digest()
	if err != nil {
		return false, fmt.Errorf("built-in template %s: %w", id, err)
	}
	img, err := images.Image(digest.String())
	if err != nil {
		return false, nil
	}
	for _, b := range img.Blobs() {
		if !images.HasBlob(b) {
			return false, nil
		}
	}
	listed := false
	err = st.View(ctx, func(tx store.Tx) error {
		t, err := lookup(ctx, tx, operator, id, false)
		if connect.CodeOf(err) == connect.CodeNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		_, listed = t.find(imagestore.Revision(digest.String()))
		return nil
	})
	return listed, err
}
