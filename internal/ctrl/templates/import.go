package templates

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/registry"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// Sources of a revision, as TemplateRevision.source reports them.
const (
	SourceArchive   = "archive"
	SourceOCILayout = "oci-layout"
	SourceRegistry  = "registry:" // + the reference
	SourceBuiltin   = "builtin"
)

const importMethod = ctrlv1connect.TemplateServiceImportTemplateRevisionProcedure

// ImportTemplateRevision runs one upload. recv returns the upload's next
// message, or io.EOF once the client has closed its side.
//
// An archive is spooled to a file under the image store (at most
// MaxArchiveBytes), hashing it on the way: the command's input is the start
// message and the archive's SHA-256, so a retry with the same bytes
// replays. The image is then imported into the image store outside every
// transaction, and the revision, the Template's change and the command
// record are stored in one.
func (s *Service) ImportTemplateRevision(ctx context.Context,
	recv func() (*ctrlv1.ImportTemplateRevisionRequest, error)) (*ctrlv1.ImportTemplateRevisionResponse, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	first, err := recv()
	if errors.Is(err, io.EOF) {
		return nil, invalid("the upload is empty: its first message must be start")
	}
	if err != nil {
		return nil, err
	}
	start := first.GetStart()
	if start == nil {
		return nil, invalid("a chunk came before start: the first message must be start")
	}
	if err := checkStart(start); err != nil {
		return nil, err
	}
	if err := command.ValidateID(start.GetCommand().GetCommandId()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err := s.precheck(ctx, c, start); err != nil {
		return nil, err
	}

	var archive string
	var sum []byte
	if _, ok := start.GetSource().(*ctrlv1.ImportTemplateRevisionStart_Archive); ok {
		var digest [sha256.Size]byte
		if archive, digest, err = s.spool(ctx, recv); err != nil {
			return nil, err
		}
		defer os.Remove(archive)
		sum = digest[:]
	} else if err := noChunks(recv); err != nil {
		return nil, err
	}

	cm, err := resource.CommandOf(ctx, Write[*ctrlv1.ImportTemplateRevisionResponse]{Method: importMethod, Command: start.GetCommand(),
		Input: &wrapperspb.BytesValue{Value: commandInput(start, sum)}, New: resource.NewMessage[*ctrlv1.ImportTemplateRevisionResponse]})
	if err != nil {
		return nil, err
	}
	if resp, found, err := command.Replay(ctx, s.Store, cm); err != nil || found {
		return resp, err
	}
	img, source, err := s.pull(ctx, start, archive)
	if err != nil {
		return nil, err
	}
	rev, err := describe(ctx, s.Images, img, source)
	if err != nil {
		return nil, err
	}
	if err := s.Shared.Share(ctx, img); err != nil {
		return nil, importError(ctx, err, connect.CodeUnavailable)
	}
	return command.Run(ctx, s.Store, cm, func(ctx context.Context, tx store.Tx) (*ctrlv1.ImportTemplateRevisionResponse, error) {
		t, err := lookup(ctx, tx, c, start.GetTemplateId(), true)
		if err != nil {
			return nil, err
		}
		r, err := addRevision(ctx, tx, t, img, rev, start.GetSetDefault(), s.Now.UTC())
		if err != nil {
			return nil, err
		}
		return &ctrlv1.ImportTemplateRevisionResponse{Template: t.view(), Revision: proto.CloneOf(r)}, nil
	})
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err) // a generated message always marshals
	}
	return b
}

// checkStart validates a start message's fields.
func checkStart(start *ctrlv1.ImportTemplateRevisionStart) error {
	if start.GetTemplateId() == "" {
		return invalid("start.template_id is required")
	}
	switch src := start.GetSource().(type) {
	case *ctrlv1.ImportTemplateRevisionStart_Archive:
		switch src.Archive {
		case ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL, ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_OCI_LAYOUT_TAR:
		case ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_UNSPECIFIED:
			return invalid("start.archive is unspecified: name the archive's format (TARBALL or OCI_LAYOUT_TAR)")
		default:
			return invalid("start.archive %d is not a known archive format", src.Archive)
		}
	case *ctrlv1.ImportTemplateRevisionStart_RegistryReference:
		if _, err := name.ParseReference(src.RegistryReference); err != nil {
			return invalid("start.registry_reference: %v", err)
		}
		if _, err := registry.ParsePlatform(start.GetPlatform()); err != nil {
			return invalid("start.platform: %v", err)
		}
		return nil
	default:
		return invalid("start needs a source: an archive format or a registry_reference")
	}
	switch {
	case start.GetRegistryCredentials() != nil:
		return invalid("start.registry_credentials go with a registry_reference, not an archive")
	case start.GetPlatform() != "":
		return invalid("start.platform goes with a registry_reference, not an archive")
	}
	return nil
}

// commandInput is what a retry of the import must repeat: start without
// the registry credentials, which may be renewed between attempts, and
// the archive's SHA-256.
func commandInput(start *ctrlv1.ImportTemplateRevisionStart, archiveSum []byte) []byte {
	start = proto.CloneOf(start)
	start.RegistryCredentials = nil
	h := sha256.Sum256(mustMarshal(start))
	return append(h[:], archiveSum...)
}

// precheck refuses, before any byte is read, an upload into a Template the
// caller cannot write, unless the command ran before (then its outcome
// replays whatever the Template's state now).
func (s *Service) precheck(ctx context.Context, c auth.Caller, start *ctrlv1.ImportTemplateRevisionStart) error {
	return s.Store.View(ctx, func(tx store.Tx) error {
		rec, err := tx.Command(ctx, c.ProjectID, start.GetCommand().GetCommandId())
		if err == nil && rec.Method == importMethod {
			return nil
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		_, err = lookup(ctx, tx, c, start.GetTemplateId(), true)
		return err
	})
}

// spool writes the chunks that follow start to a new file under the image
// store and returns its path and SHA-256.
func (s *Service) spool(ctx context.Context, recv func() (*ctrlv1.ImportTemplateRevisionRequest, error)) (path string, sum [sha256.Size]byte, err error) {
	f, err := os.CreateTemp(filepath.Join(s.Images.Dir(), "tmp"), "upload-*")
	if err != nil {
		return "", sum, err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	w := io.MultiWriter(f, h)
	limit := s.maxArchiveBytes()
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return "", sum, contextError(err)
		}
		m, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", sum, err
		}
		switch part := m.GetPart().(type) {
		case *ctrlv1.ImportTemplateRevisionRequest_Chunk:
			if n += int64(len(part.Chunk)); n > limit {
				return "", sum, connect.NewError(connect.CodeResourceExhausted,
					fmt.Errorf("the archive is larger than the limit of %d bytes", limit))
			}
			if _, err := w.Write(part.Chunk); err != nil {
				return "", sum, err
			}
		case *ctrlv1.ImportTemplateRevisionRequest_Start:
			return "", sum, invalid("a second start came after the first")
		default:
			return "", sum, invalid("a message carries neither start nor chunk")
		}
	}
	if n == 0 {
		return "", sum, invalid("the archive is empty: send its bytes as chunk messages after start")
	}
	copy(sum[:], h.Sum(nil))
	return f.Name(), sum, nil
}

// noChunks reads the rest of a registry import's upload, which must end
// right after start.
func noChunks(recv func() (*ctrlv1.ImportTemplateRevisionRequest, error)) error {
	m, err := recv()
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err
	case m.GetStart() != nil:
		return invalid("a second start came after the first")
	default:
		return invalid("a registry_reference import takes no chunks")
	}
}

// pull imports the start's image into the image store.
func (s *Service) pull(ctx context.Context, start *ctrlv1.ImportTemplateRevisionStart, archive string) (imagestore.Image, string, error) {
	switch src := start.GetSource().(type) {
	case *ctrlv1.ImportTemplateRevisionStart_Archive:
		var (
			img imagestore.Image
			err error
		)
		source := SourceArchive
		if src.Archive == ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_OCI_LAYOUT_TAR {
			source = SourceOCILayout
			img, err = s.importLayoutTar(ctx, archive)
		} else {
			img, err = s.Images.ImportArchiveFile(ctx, archive)
		}
		if err != nil {
			return imagestore.Image{}, "", importError(ctx, err, connect.CodeInvalidArgument)
		}
		return img, source, nil
	case *ctrlv1.ImportTemplateRevisionStart_RegistryReference:
		ref := src.RegistryReference
		if s.Registry == nil {
			return imagestore.Image{}, "", connect.NewError(connect.CodeUnavailable,
				errors.New("this deployment does not pull from registries: upload an image archive instead"))
		}
		platform, err := registry.ParsePlatform(start.GetPlatform())
		if err != nil {
			return imagestore.Image{}, "", invalid("start.platform: %v", err)
		}
		c := start.GetRegistryCredentials()
		remote, err := s.Registry.Pull(ctx, ref, platform,
			registry.Credentials{Username: c.GetUsername(), Password: c.GetPassword(), IdentityToken: c.GetIdentityToken()})
		if err != nil {
			return imagestore.Image{}, "", registryError(ctx, err)
		}
		if err := s.checkPullSize(remote); err != nil {
			return imagestore.Image{}, "", registryError(ctx, err)
		}
		img, err := s.Images.ImportImage(ctx, remote)
		if err != nil {
			if berr := registry.BlobError(ref, err); registry.Classified(berr) {
				return imagestore.Image{}, "", registryError(ctx, berr)
			}
			return imagestore.Image{}, "", importError(ctx, err, connect.CodeUnavailable)
		}
		return img, SourceRegistry + ref, nil
	}
	return imagestore.Image{}, "", invalid("start needs a source")
}

func (s *Service) importLayoutTar(ctx context.Context, path string) (imagestore.Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return imagestore.Image{}, err
	}
	defer f.Close()
	return s.Images.ImportOCILayoutTar(ctx, f)
}

// importError maps an import's error: the image's faults are
// invalid_argument, cancellation keeps its code, the machine's own
// failures (a full disk) are internal, and anything else is fallback (the
// archive's fault for an upload, the registry's for a pull).
func importError(ctx context.Context, err error, fallback connect.Code) error {
	if cerr := ctx.Err(); cerr != nil {
		return contextError(cerr)
	}
	var errno syscall.Errno
	switch {
	case errors.Is(err, imagestore.ErrInvalidImage), errors.Is(err, imagestore.ErrUnsupportedPlatform),
		errors.Is(err, imagestore.ErrDigestMismatch), errors.Is(err, imagestore.ErrInvalidDigest):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.As(err, &errno) && localFailure(errno):
		return err
	}
	return connect.NewError(fallback, err)
}

// localFailure reports whether errno is this machine's problem rather than
// the input's.
func localFailure(errno syscall.Errno) bool {
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EROFS, syscall.EMFILE, syscall.ENFILE,
		syscall.EACCES, syscall.EPERM, syscall.ENOMEM:
		return true
	}
	return false
}

// registryError maps an error of a pull (see Puller).
func registryError(ctx context.Context, err error) error {
	var ce *connect.Error
	switch {
	case ctx.Err() != nil:
		return contextError(ctx.Err())
	case errors.As(err, &ce):
		return ce
	case errors.Is(err, registry.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, registry.ErrDenied):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, registry.ErrRefused):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, registry.ErrBadReference), errors.Is(err, registry.ErrBadBlob):
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

// checkPullSize refuses, before any blob is read, an image whose manifest
// declares more bytes than an uploaded archive may have: the registry's
// blobs are then read up to their declared sizes and digests.
func (s *Service) checkPullSize(img v1.Image) error {
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	total := m.Config.Size
	for _, l := range m.Layers {
		if l.Size < 0 || total > math.MaxInt64-l.Size {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the image's manifest declares a layer of %d bytes", l.Size))
		}
		total += l.Size
	}
	if limit := s.maxArchiveBytes(); total > limit {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("the image is %d bytes, more than the limit of %d bytes", total, limit))
	}
	return nil
}

// describe returns the API view of an imported image as a revision, all
// but created_at.
func describe(ctx context.Context, images *imagestore.Store, img imagestore.Image, source string) (*ctrlv1.TemplateRevision, error) {
	rev := imagestore.Revision(img.ManifestDigest)
	if rev == "" {
		return nil, fmt.Errorf("imported image has an invalid manifest digest %q", img.ManifestDigest)
	}
	var size uint64
	seen := map[string]bool{}
	for _, l := range img.Layers {
		if !seen[l.Digest] {
			seen[l.Digest] = true
			size += uint64(l.Size)
		}
	}
	unpacked, err := unpackedBytes(ctx, images, img)
	if err != nil {
		return nil, importError(ctx, err, connect.CodeInvalidArgument)
	}
	out := &ctrlv1.TemplateRevision{
		Revision: rev, ImageDigest: img.ManifestDigest, SizeBytes: size, UnpackedBytes: unpacked, Source: source,
	}
	if d := img.Config.Display; d != nil {
		out.Display = &ctrlv1.TemplateDisplay{Width: d.Width, Height: d.Height}
	}
	return out, nil
}

// addRevision adds an imported image to t as revision rev (whose
// created_at it sets) unless t already has it, makes it the default when t
// has none or setDefault asks, and stores t. It returns t's revision of the
// image.
func addRevision(ctx context.Context, tx store.Tx, t *tmpl, img imagestore.Image, rev *ctrlv1.TemplateRevision,
	setDefault bool, now time.Time) (*ctrlv1.TemplateRevision, error) {
	id, revName := t.obj.ID, rev.GetRevision()
	changed := false
	r, ok := t.find(revName)
	if !ok {
		rows, err := tx.TemplateRevisions(ctx, t.obj.ProjectID, id)
		if err != nil {
			return nil, err
		}
		r = proto.CloneOf(rev)
		r.CreatedAt = timestamppb.New(now)
		if i := slices.IndexFunc(rows, func(row store.TemplateRevision) bool { return row.Revision == revName }); i >= 0 {
			// The row of an earlier incarnation: list it anew (see the
			// package doc).
			old, _, err := DecodeRevision(rows[i])
			if err != nil {
				return nil, err
			}
			r.ImageDigest = old.GetImageDigest()
		} else {
			body, err := EncodeRevision(r, storedImage(id, revName, img))
			if err != nil {
				return nil, err
			}
			row := store.TemplateRevision{ProjectID: t.obj.ProjectID, TemplateID: id, Revision: revName, Body: body, CreatedAt: now}
			if err := tx.PutTemplateRevision(ctx, row); err != nil {
				return nil, err
			}
		}
		t.spec.Revisions = append(t.spec.Revisions, r)
		changed = true
	}
	if d := r.GetImageDigest(); d != img.ManifestDigest {
		return nil, fmt.Errorf("template %s: revision %s is image %s, not %s", id, revName, d, img.ManifestDigest)
	}
	if cur := t.spec.GetDefaultRevision(); cur == "" || setDefault && cur != revName {
		t.spec.DefaultRevision = revName
		t.obj.Revision++
		changed = true
	}
	if changed {
		t.obj.UpdatedAt = now
		if err := t.save(ctx, tx); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// storedImage is the image of a revision as hosts need it.
func storedImage(templateID, revision string, img imagestore.Image) Image {
	out := Image{TemplateID: templateID, Revision: revision, Digest: img.ManifestDigest, Env: img.Config.Env, Display: img.Config.Display}
	for _, l := range img.Layers {
		out.Layers = append(out.Layers, Layer{Digest: l.Digest, DiffID: l.DiffID, Size: l.Size})
	}
	return out
}

// contextError is the error of a call whose context ended.
func contextError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeCanceled, err)
}
