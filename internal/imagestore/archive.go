package imagestore

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ImportArchive imports an image archive as `docker save`, `crane pull` or
// `skopeo copy ... docker-archive:` write it. The archive must hold exactly one image
// (ErrInvalidImage otherwise) for linux/amd64 (ErrUnsupportedPlatform otherwise).
func (s *Store) ImportArchive(ctx context.Context, r io.Reader) (Image, error) {
	img, err := s.importArchive(ctx, r)
	if err != nil {
		return Image{}, fmt.Errorf("import image archive: %w", err)
	}
	return img, nil
}

func (s *Store) importArchive(ctx context.Context, r io.Reader) (Image, error) {
	// tarball reads the archive several times, by name: spool it to a file.
	f, err := os.CreateTemp(s.tmpDir(), "archive-*")
	if err != nil {
		return Image{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := io.Copy(f, ctxReader{ctx, r}); err != nil {
		return Image{}, fmt.Errorf("spooling: %w", err)
	}
	return s.importArchiveFile(ctx, f.Name())
}

// ImportArchiveFile is ImportArchive of the archive file at path, read in place.
func (s *Store) ImportArchiveFile(ctx context.Context, path string) (Image, error) {
	img, err := s.importArchiveFile(ctx, path)
	if err != nil {
		return Image{}, fmt.Errorf("import image archive: %w", err)
	}
	return img, nil
}

func (s *Store) importArchiveFile(ctx context.Context, path string) (Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	entries, err := archiveEntries(ctx, opener)
	if err != nil {
		return Image{}, err
	}
	// tarball reads manifest.json and the config whole, and the config
	// before anything is known of its size.
	if err := documentFits(entries, "manifest.json", "manifest.json"); err != nil {
		return Image{}, err
	}
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return Image{}, fmt.Errorf("%w: reading manifest.json: %v", ErrInvalidImage, err)
	}
	if len(m) != 1 {
		return Image{}, fmt.Errorf("%w: archive holds %d images, want exactly 1", ErrInvalidImage, len(m))
	}
	if err := documentFits(entries, m[0].Config, "its config"); err != nil {
		return Image{}, err
	}
	img, err := tarball.Image(opener, nil)
	if err != nil {
		return Image{}, fmt.Errorf("%w: %v", ErrInvalidImage, err)
	}
	return s.importImage(ctx, img)
}

// archiveEntries reads the archive's headers and returns the first of each
// name, as tarball finds an entry. It refuses a sparse entry: its holes would
// be read as zeros, as many as it declares, however small the archive (image
// archives never hold one; only layers inside may).
func archiveEntries(ctx context.Context, open func() (io.ReadCloser, error)) (map[string]*tar.Header, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	entries := map[string]*tar.Header{}
	tr := tar.NewReader(ctxReader{ctx, rc})
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries, nil
		}
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr
			}
			return nil, fmt.Errorf("%w: reading the archive: %v", ErrInvalidImage, err)
		}
		if err := notSparse(hdr); err != nil {
			return nil, err
		}
		if name := path.Clean(hdr.Name); entries[name] == nil {
			entries[name] = hdr
		}
	}
}

// documentFits refuses (ErrInvalidImage) the archive's entry at name, which
// tarball reads whole, when it is over maxConfigBytes: what, a
// description, names it. A link is followed as tarball follows it, through
// at most maxLinks of them; an entry that is missing is left for tarball
// to report.
func documentFits(entries map[string]*tar.Header, name, what string) error {
	for range maxLinks {
		hdr := entries[path.Clean(name)]
		if hdr == nil {
			return nil
		}
		if hdr.Typeflag != tar.TypeSymlink && hdr.Typeflag != tar.TypeLink {
			if hdr.Size > maxConfigBytes {
				return fmt.Errorf("%w: %s is %d bytes; at most %d are taken", ErrInvalidImage, what, hdr.Size, maxConfigBytes)
			}
			return nil
		}
		name = path.Join(path.Dir(name), path.Clean(hdr.Linkname))
	}
	return fmt.Errorf("%w: %s is reached through more than %d links", ErrInvalidImage, what, maxLinks)
}

// maxLinks bounds the chain of links to an archive's document (tarball
// follows any number).
const maxLinks = 16

// notSparse refuses a sparse tar entry (old GNU or PAX GNU.sparse format).
func notSparse(hdr *tar.Header) error {
	sparse := hdr.Typeflag == tar.TypeGNUSparse
	for k := range hdr.PAXRecords {
		sparse = sparse || strings.HasPrefix(k, "GNU.sparse.")
	}
	if sparse {
		return fmt.Errorf("%w: archive entry %q is a sparse file; image archives may not hold one", ErrInvalidImage, hdr.Name)
	}
	return nil
}

// ImportOCILayoutTar imports a tar of an OCI image layout directory, as
// `skopeo copy ... oci-archive:` writes it (the layout may also be the tar's only
// top-level directory). The tar may hold only directories, regular files and hard
// links between them; an entry escaping the root, or any other kind, is refused with
// ErrInvalidImage. The layout must resolve to exactly one linux/amd64 image, as in
// ImportLayoutDir.
func (s *Store) ImportOCILayoutTar(ctx context.Context, r io.Reader) (Image, error) {
	dir, err := os.MkdirTemp(s.tmpDir(), "layout-*")
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(dir)
	if err := extractPlainTar(ctx, r, dir); err != nil {
		return Image{}, fmt.Errorf("import OCI layout tar: %w", err)
	}
	return s.ImportLayoutDir(ctx, layoutRoot(dir))
}

// layoutRoot returns dir, or its only subdirectory if the layout was tarred with
// its directory name.
func layoutRoot(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
		return dir
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != 1 || !ents[0].IsDir() {
		return dir
	}
	return filepath.Join(dir, ents[0].Name())
}

// ImportLayoutDir imports the image of the OCI image layout at dir. Its index may name
// one image, or an image index to resolve: the single linux/amd64 manifest (entries
// for other platforms, such as attestation manifests, are skipped). No or several
// candidate images give ErrInvalidImage.
func (s *Store) ImportLayoutDir(ctx context.Context, dir string) (Image, error) {
	img, err := layoutImage(dir)
	if err != nil {
		return Image{}, fmt.Errorf("import OCI layout: %w", err)
	}
	out, err := s.importImage(ctx, img)
	if err != nil {
		return Image{}, fmt.Errorf("import OCI layout: %w", err)
	}
	return out, nil
}

// layoutImage returns the image of the layout at dir (pickImage), its
// documents checked before they are read (checkLayoutDocument) and its
// layers' blobs present: the layout package reads each document whole and
// takes every blob for what its name says.
func layoutImage(dir string) (v1.Image, error) {
	if fi, err := os.Stat(filepath.Join(dir, "index.json")); err == nil && fi.Size() > maxConfigBytes {
		return nil, fmt.Errorf("%w: index.json is %d bytes; at most %d are taken", ErrInvalidImage, fi.Size(), maxConfigBytes)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidImage, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidImage, err)
	}
	img, err := pickImage(dir, idx, 0)
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidImage, err)
	}
	if err := checkLayoutDocument(dir, m.Config, "config"); err != nil {
		return nil, err
	}
	for _, l := range m.Layers {
		if fi, err := os.Stat(layoutBlob(dir, l.Digest)); err != nil || !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%w: the layout holds no blob of layer %s", ErrInvalidImage, l.Digest)
		}
	}
	return img, nil
}

// layoutBlob is the path of a blob in the layout at dir.
func layoutBlob(dir string, h v1.Hash) string {
	return filepath.Join(dir, "blobs", h.Algorithm, h.Hex)
}

// checkLayoutDocument refuses (ErrInvalidImage) the blob of d, a document
// of the layout at dir (what: an index, a manifest, the config), that is
// missing, over maxConfigBytes, or not what d names.
func checkLayoutDocument(dir string, d v1.Descriptor, what string) error {
	if d.Digest.Algorithm != "sha256" {
		return fmt.Errorf("%w: the %s is named by a %s digest; only sha256 is taken", ErrInvalidImage, what, d.Digest.Algorithm)
	}
	p := layoutBlob(dir, d.Digest)
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: the layout holds no blob of the %s %s", ErrInvalidImage, what, d.Digest)
	}
	if fi.Size() > maxConfigBytes {
		return fmt.Errorf("%w: the %s %s is %d bytes; at most %d are taken", ErrInvalidImage, what, d.Digest, fi.Size(), maxConfigBytes)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if got := sha256Digest(b); got != d.Digest.String() || int64(len(b)) != d.Size {
		return fmt.Errorf("%w: the %s named %s (%d bytes) is %s (%d bytes)", ErrInvalidImage, what, d.Digest, d.Size, got, len(b))
	}
	return nil
}

var linuxAMD64 = v1.Platform{OS: "linux", Architecture: "amd64"}

// pickImage returns the single linux/amd64 image of idx, of the layout at
// dir, descending into nested
// indexes. A descriptor without a platform is a candidate only if no descriptor
// names linux/amd64.
func pickImage(dir string, idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, fmt.Errorf("%w: image indexes nested too deeply", ErrInvalidImage)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidImage, err)
	}
	var matching, unplatformed []v1.Descriptor
	var others []string
	for _, d := range im.Manifests {
		if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
			continue
		}
		switch {
		case d.Platform == nil:
			unplatformed = append(unplatformed, d)
		case d.Platform.OS == linuxAMD64.OS && d.Platform.Architecture == linuxAMD64.Architecture:
			matching = append(matching, d)
		default:
			others = append(others, d.Platform.String())
		}
	}
	cands := matching
	if len(cands) == 0 {
		cands = unplatformed
	}
	cands = uniqueDigests(cands)
	switch {
	case len(cands) == 0 && len(others) > 0:
		return nil, fmt.Errorf("%w: no linux/amd64 image, layout has %s", ErrUnsupportedPlatform, strings.Join(others, ", "))
	case len(cands) == 0:
		return nil, fmt.Errorf("%w: layout holds no image", ErrInvalidImage)
	case len(cands) > 1:
		return nil, fmt.Errorf("%w: layout holds %d linux/amd64 images, want exactly 1", ErrInvalidImage, len(cands))
	}
	d := cands[0]
	if d.MediaType.IsIndex() {
		if err := checkLayoutDocument(dir, d, "index"); err != nil {
			return nil, err
		}
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidImage, err)
		}
		return pickImage(dir, child, depth+1)
	}
	if err := checkLayoutDocument(dir, d, "manifest"); err != nil {
		return nil, err
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidImage, err)
	}
	return img, nil
}

func uniqueDigests(ds []v1.Descriptor) []v1.Descriptor {
	var out []v1.Descriptor
	seen := map[v1.Hash]bool{}
	for _, d := range ds {
		if !seen[d.Digest] {
			seen[d.Digest] = true
			out = append(out, d)
		}
	}
	return out
}

// extractPlainTar extracts directories, regular files and hard links from r into dir,
// refusing entries that would escape it, sparse files and every other entry type. Since no symlink
// is ever created, no later entry can be redirected outside dir.
func extractPlainTar(ctx context.Context, r io.Reader, dir string) error {
	tr := tar.NewReader(ctxReader{ctx, r})
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: reading tar: %v", ErrInvalidImage, err)
		}
		name, err := entryPath(hdr.Name)
		if err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if err := notSparse(hdr); err != nil {
			return err
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			continue
		case tar.TypeReg, tar.TypeLink:
		case tar.TypeXGlobalHeader:
			continue
		default:
			return fmt.Errorf("%w: tar entry %q has type %q; only directories, files and hard links are allowed", ErrInvalidImage, hdr.Name, hdr.Typeflag)
		}
		if name == "." {
			return fmt.Errorf("%w: tar entry %q is not a file name", ErrInvalidImage, hdr.Name)
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if hdr.Typeflag == tar.TypeLink {
			old, err := entryPath(hdr.Linkname)
			if err != nil {
				return fmt.Errorf("tar entry %q: link target: %w", hdr.Name, err)
			}
			if err := os.Link(filepath.Join(dir, filepath.FromSlash(old)), target); err != nil {
				return fmt.Errorf("%w: tar entry %q: %v", ErrInvalidImage, hdr.Name, err)
			}
			continue
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%w: tar entry %q: %v", ErrInvalidImage, hdr.Name, err)
		}
	}
}

// entryPath returns a tar entry name as a clean slash-separated path relative to the
// extraction root ("." for the root itself). A leading "/" is taken as the root; a
// name that climbs above the root is refused with ErrInvalidImage.
func entryPath(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: bad name %q", ErrInvalidImage, name)
	}
	p := strings.TrimPrefix(path.Clean(name), "/")
	if p == "" {
		p = "."
	}
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("%w: %q escapes the root", ErrInvalidImage, name)
	}
	return p, nil
}
