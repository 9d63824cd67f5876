package artifact

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"hash"
	"hash/maphash"
	"io"
	"path"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Limits of what a reader accepts.
const (
	maxManifestBytes = 1 << 20
	// maxPathBytes bounds an entry's path inside its section and a
	// link's target (inside its section for a hard link): PATH_MAX less
	// its terminating NUL, the longest path Linux takes in one call, so
	// the longest a writer walking relative to the section's root reads
	// and an extractor opens below it, and the longest target symlink(2)
	// takes.
	maxPathBytes = 4095
	// maxNameBytes bounds an entry's whole name and link target: the
	// longest section's name, a slash and maxPathBytes.
	maxNameBytes = len(Template) + 1 + maxPathBytes
)

// zstdMagic starts every zstd frame.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// Entry is one entry of a section.
type Entry struct {
	Header *tar.Header
	// Section is Layer, Volume or Template; Rel is the path inside it,
	// "" for the section's root directory.
	Section, Rel string
	// Size is a regular file's logical size; Extents its data extents
	// (offset, length), whose concatenation is the entry's content.
	Size    int64
	Extents [][2]int64
	// Xattrs are the extended attributes by name.
	Xattrs map[string]string
}

// errReader remembers the error, other than EOF, of the reader it wraps:
// of the artifact's source, so that it is reported as such rather than as
// invalid content, and of an entry's content, which is the archive's
// error, not that of the fn reading it.
type errReader struct {
	r   io.Reader
	err error
}

func (s *errReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		s.err = err
	}
	return n, err
}

// Walk reads an artifact from r, checks it whole, and returns its
// manifest. fn, when not nil, is called for each entry of a section with
// a reader of its content (for a regular file, its data extents
// concatenated), which fn may read in part or not at all. Walk verifies
// every checksum and the trailer only once it reached the end, so a
// caller must not trust what fn saw before Walk returned nil. An error
// about the content wraps ErrInvalid; one fn or r returned is returned as
// it is, and ctx's error once ctx is done (checked at each entry and
// each read of content, so that an artifact whose content decompresses
// far beyond its size can still be given up).
func Walk(ctx context.Context, r io.Reader, fn func(e *Entry, content io.Reader) error) (*ctrlv1.TransferManifest, error) {
	w, err := newWalker(ctx, r, fn)
	if err != nil {
		return nil, err
	}
	defer w.close()
	m, err := w.walk()
	if err != nil {
		return nil, err
	}
	// Nothing may follow the archive.
	if n, err := io.Copy(io.Discard, w.z); err != nil {
		return nil, w.contentErr(err, "after its end")
	} else if n != 0 {
		return nil, invalid("data follows its end")
	}
	return m, nil
}

// Filesystems reads the manifest entry at the start of an artifact from r,
// and nothing after it, and returns the layouts of the filesystems its
// sections were read from (nil for an artifact that records none). It
// checks no more than that entry: only Walk vouches for an artifact.
func Filesystems(r io.Reader) (map[string]json.RawMessage, error) {
	w, err := newWalker(context.Background(), r, nil)
	if err != nil {
		return nil, err
	}
	defer w.close()
	b, err := w.manifest()
	if err != nil {
		return nil, err
	}
	env, err := decodeEnvelope(b)
	return env.Filesystems, err
}

// newWalker starts reading the artifact from r until ctx is done; close
// releases it.
func newWalker(ctx context.Context, r io.Reader, fn func(e *Entry, content io.Reader) error) (*walker, error) {
	src := &errReader{r: r}
	br := bufio.NewReaderSize(src, 64<<10)
	magic, err := br.Peek(len(zstdMagic))
	if src.err != nil {
		return nil, src.err
	}
	if err != nil || !bytes.Equal(magic, zstdMagic) {
		return nil, invalid("it is not zstd-compressed, so not a Kibotos transfer artifact (%s)", Format)
	}
	zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	z := &errReader{r: zr}
	tr := tar.NewReader(z)
	return &walker{ctx: ctx, tr: tr, content: &ctxReader{ctx: ctx, r: tr}, src: src, z: z, zr: zr, fn: fn, sums: sha256.New(),
		seed: maphash.MakeSeed()}, nil
}

type walker struct {
	ctx context.Context
	tr  *tar.Reader
	// content reads the current entry's content from tr until ctx is done.
	content io.Reader
	// src is the artifact as read, z the archive as decompressed (by zr).
	src, z *errReader
	zr     *zstd.Decoder
	fn     func(*Entry, io.Reader) error
	// sums hashes the trailer's lines of the regular files read so far,
	// sumsBytes long, which the trailer must repeat: a trailer is as long
	// as the archive has files, more than memory should hold.
	sums      hash.Hash
	sumsBytes int64
	entries   int
	// section is the section of the latest entry, earlier the names of
	// its entries other than directories, hashed with seed (8 bytes a
	// name): what a hard link may point at.
	section string
	earlier map[uint64]bool
	seed    maphash.Seed
	// tpl checks the template section; nil when the manifest carries no
	// template.
	tpl *templateCheck
}

// contentErr turns a read error into the context's or the source's
// error, or an invalid artifact saying what.
func (w *walker) contentErr(err error, what string) error {
	switch {
	case w.ctx.Err() != nil:
		return w.ctx.Err()
	case w.src.err != nil:
		return w.src.err
	case w.z.err != nil && !errors.Is(w.z.err, io.ErrUnexpectedEOF):
		return invalid("it is damaged: its compressed data does not decode (%s): %v", what, w.z.err)
	case err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("it is truncated: it ends inside its data (%s)", what)
	}
	return invalid("it is damaged: %s: %v", what, err)
}

func (w *walker) next(what string) (*tar.Header, error) {
	if err := w.ctx.Err(); err != nil {
		return nil, err
	}
	hdr, err := w.tr.Next()
	if errors.Is(err, io.EOF) {
		return nil, invalid("it is truncated: it ends before %s", what)
	}
	if err != nil {
		return nil, w.contentErr(err, "reading "+what)
	}
	return hdr, refuseGNUSparse(hdr)
}

// refuseGNUSparse refuses an entry in a GNU sparse format: archive/tar
// reads one as a regular file whose holes it fills with zeros, up to any
// size its header claims without data to match. The format's sparse
// files use KIBOTOS.sparse; an old GNU sparse entry has its own type,
// which no check of a type takes.
func refuseGNUSparse(hdr *tar.Header) error {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return invalid("entry %.100q is a GNU sparse file (GNU.sparse.* records); the format's sparse files use %s", hdr.Name, paxSparse)
		}
	}
	return nil
}

// ctxReader reads from r until ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// readAll reads a whole small entry, hashing it into the sums.
func (w *walker) readAll(hdr *tar.Header, limit int64) ([]byte, error) {
	if hdr.Typeflag != tar.TypeReg || hdr.Size > limit {
		return nil, invalid("entry %s is not a regular file of at most %d bytes", hdr.Name, limit)
	}
	b := make([]byte, hdr.Size)
	if _, err := io.ReadFull(w.tr, b); err != nil {
		return nil, w.contentErr(err, "reading "+hdr.Name)
	}
	return b, nil
}

func (w *walker) sum(content []byte, name string) {
	s := sha256.Sum256(content)
	w.addSum(s[:], name)
}

func (w *walker) addSum(s []byte, name string) {
	w.entries++
	line := sumLine(s, name)
	w.sums.Write([]byte(line))
	w.sumsBytes += int64(len(line))
}

func (w *walker) close() { w.zr.Close() }

// manifest reads the first entry, which must be the manifest, and returns
// its content.
func (w *walker) manifest() ([]byte, error) {
	hdr, err := w.tr.Next()
	if err != nil {
		if w.src.err != nil || w.z.err != nil {
			return nil, w.contentErr(err, "reading its first entry")
		}
		// A flipped byte in the first entry's header decodes without an
		// error until the frame's checksum, which may come much later:
		// damage and a foreign archive look alike here.
		return nil, invalid("it holds no tar archive, so it is damaged or not a Kibotos transfer artifact (%s): %v", Format, err)
	}
	if hdr.Name != ManifestName {
		return nil, invalid("its first entry is %.100q, not %s: not a Kibotos transfer artifact", hdr.Name, ManifestName)
	}
	if err := refuseGNUSparse(hdr); err != nil {
		return nil, err
	}
	return w.readAll(hdr, maxManifestBytes)
}

func (w *walker) walk() (*ctrlv1.TransferManifest, error) {
	b, err := w.manifest()
	if err != nil {
		return nil, err
	}
	m, err := DecodeManifest(b)
	if err != nil {
		return nil, err
	}
	w.sum(b, ManifestName)
	w.tpl = newTemplateCheck(m)
	for {
		hdr, err := w.next("its trailer")
		if err != nil {
			return nil, err
		}
		if hdr.Name == TrailerName {
			if err := w.checkTrailer(hdr); err != nil {
				return nil, err
			}
			return m, w.tpl.finish()
		}
		if err := w.entry(hdr); err != nil {
			return nil, err
		}
	}
}

// entry checks one entry, hands it to fn, and sums its content.
func (w *walker) entry(hdr *tar.Header) error {
	e, err := parseEntry(hdr)
	if err != nil {
		return err
	}
	if err := w.link(hdr, e.Section); err != nil {
		return err
	}
	var kept *bytes.Buffer
	if e.Section == Template {
		if kept, err = w.tpl.admit(e); err != nil {
			return err
		}
	}
	if hdr.Typeflag != tar.TypeReg {
		w.entries++
		if w.fn != nil {
			return w.fn(e, bytes.NewReader(nil))
		}
		return nil
	}
	h := sha256.New()
	var sink io.Writer = h
	if kept != nil {
		sink = io.MultiWriter(h, kept)
	}
	content := &errReader{r: io.TeeReader(w.content, sink)}
	if w.fn != nil {
		if err := w.fn(e, content); err != nil {
			if content.err != nil {
				return w.contentErr(content.err, "reading "+hdr.Name)
			}
			return err
		}
	}
	if _, err := io.Copy(io.Discard, content); err != nil {
		return w.contentErr(err, "reading "+hdr.Name)
	}
	w.addSum(h.Sum(nil), hdr.Name)
	if e.Section == Template {
		return w.tpl.done(e, h.Sum(nil), kept)
	}
	return nil
}

// link checks that a hard link points at an earlier entry of its section
// other than a directory, as extraction needs, and records an entry that
// a later link may point at.
func (w *walker) link(hdr *tar.Header, section string) error {
	if section != w.section {
		w.section, w.earlier = section, map[uint64]bool{}
	}
	if hdr.Typeflag == tar.TypeLink && !w.earlier[maphash.String(w.seed, hdr.Linkname)] {
		return invalid("hard link %s points at %s, which is no earlier entry of its section other than a directory", hdr.Name, hdr.Linkname)
	}
	if hdr.Typeflag != tar.TypeDir {
		w.earlier[maphash.String(w.seed, hdr.Name)] = true
	}
	return nil
}

// checkTrailer compares the trailer with the sums of what preceded it,
// as it reads it.
func (w *walker) checkTrailer(hdr *tar.Header) error {
	end := entriesLine(w.entries)
	w.sums.Write([]byte(end))
	if hdr.Typeflag != tar.TypeReg || hdr.Size != w.sumsBytes+int64(len(end)) {
		return invalid("its trailer does not list the entries it holds")
	}
	got := sha256.New()
	if _, err := io.Copy(got, w.content); err != nil {
		return w.contentErr(err, "reading "+TrailerName)
	}
	if !bytes.Equal(got.Sum(nil), w.sums.Sum(nil)) {
		return invalid("its trailer does not match what it holds: a checksum differs from the one it records, or its list of entries")
	}
	if _, err := w.tr.Next(); !errors.Is(err, io.EOF) {
		return w.contentErr(err, "an entry follows the trailer")
	}
	return nil
}

// parseEntry checks an entry of a section and decodes its records.
func parseEntry(hdr *tar.Header) (*Entry, error) {
	name := hdr.Name
	section, rel, _ := strings.Cut(name, "/")
	target := hdr.Linkname
	if hdr.Typeflag == tar.TypeLink {
		_, target, _ = strings.Cut(target, "/")
	}
	if len(name) > maxNameBytes || len(hdr.Linkname) > maxNameBytes || len(rel) > maxPathBytes || len(target) > maxPathBytes {
		return nil, invalid("entry %.100q... has a path or link target over %d bytes, longer than any path Linux takes", name, maxPathBytes)
	}
	if name == "" || path.Clean(name) != name || path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
		return nil, invalid("entry name %q is not a clean relative path", name)
	}
	switch section {
	case Layer, Volume, Template:
	default:
		return nil, invalid("entry %q is outside the layer, volume and template sections", name)
	}
	e := &Entry{Header: hdr, Section: section, Rel: rel, Xattrs: map[string]string{}}
	for k, v := range hdr.PAXRecords {
		if x, ok := strings.CutPrefix(k, paxXattr); ok {
			e.Xattrs[x] = v
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
	case tar.TypeLink:
		ls, lr, _ := strings.Cut(hdr.Linkname, "/")
		if ls != section || lr == "" || path.Clean(hdr.Linkname) != hdr.Linkname {
			return nil, invalid("hard link %s points at %q, outside its section", name, hdr.Linkname)
		}
	case tar.TypeReg:
		e.Size, e.Extents = hdr.Size, [][2]int64{{0, hdr.Size}}
		if rec, ok := hdr.PAXRecords[paxSparse]; ok {
			var err error
			if e.Size, e.Extents, err = parseSparse(rec, hdr.Size); err != nil {
				return nil, invalid("entry %s: %v", name, err)
			}
		}
	default:
		return nil, invalid("entry %s has type %q, which the format does not carry", name, hdr.Typeflag)
	}
	if rel == "" && hdr.Typeflag != tar.TypeDir {
		return nil, invalid("section %s is not a directory", section)
	}
	return e, nil
}

// parseSparse decodes a KIBOTOS.sparse record of an entry holding stored
// bytes of content.
func parseSparse(rec string, stored int64) (int64, [][2]int64, error) {
	sizeText, list, ok := strings.Cut(rec, ":")
	size, err := strconv.ParseInt(sizeText, 10, 64)
	if !ok || err != nil || size < 0 {
		return 0, nil, errors.New("its sparse map has no size")
	}
	var extents [][2]int64
	if list != "" {
		fields := strings.Split(list, ",")
		if len(fields)%2 != 0 {
			return 0, nil, errors.New("its sparse map has an odd number of fields")
		}
		var end, total int64
		for i := 0; i < len(fields); i += 2 {
			off, err1 := strconv.ParseInt(fields[i], 10, 64)
			n, err2 := strconv.ParseInt(fields[i+1], 10, 64)
			if err1 != nil || err2 != nil || off < end || n <= 0 || off > size-n {
				return 0, nil, errors.New("its sparse map is not ordered extents within its size")
			}
			extents = append(extents, [2]int64{off, n})
			end, total = off+n, total+n
		}
		if total != stored {
			return 0, nil, errors.New("its sparse map does not add up to its content")
		}
	} else if stored != 0 {
		return 0, nil, errors.New("its sparse map has no extent but it has content")
	}
	return size, extents, nil
}
