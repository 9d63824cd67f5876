package artifact

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// crafted is one entry of an artifact built by hand.
type crafted struct {
	hdr  *tar.Header
	body []byte
	// rawPAX are PAX records written as they are before hdr: tar.Writer
	// leaves out some (GNU.sparse.*).
	rawPAX map[string]string
}

// craft writes an artifact of manifest m as a hostile uploader could:
// entries as given and a trailer that sums them as the format does, so
// that only the checks of the entries themselves can refuse it.
func craft(t *testing.T, m *ctrlv1.TransferManifest, entries []crafted) []byte {
	t.Helper()
	body, err := EncodeManifest(m)
	must(t, err)
	var out, trailer bytes.Buffer
	tw := tar.NewWriter(&out)
	add := func(e crafted) {
		must(t, tw.Flush())
		if e.rawPAX != nil {
			out.Write(paxHeader(t, e.rawPAX))
		}
		must(t, tw.WriteHeader(e.hdr))
		_, err := tw.Write(e.body)
		must(t, err)
		if e.hdr.Typeflag == tar.TypeReg {
			trailer.WriteString(sumLine(sha256Of(e.body), e.hdr.Name))
		}
	}
	add(crafted{hdr: fileHeader(ManifestName, len(body)), body: body})
	for _, e := range entries {
		add(e)
	}
	trailer.WriteString(entriesLine(len(entries) + 1))
	add(crafted{hdr: fileHeader(TrailerName, trailer.Len()), body: slices.Clone(trailer.Bytes())})
	must(t, tw.Close())
	var art bytes.Buffer
	zw, err := zstd.NewWriter(&art)
	must(t, err)
	_, err = zw.Write(out.Bytes())
	must(t, err)
	must(t, zw.Close())
	return art.Bytes()
}

func sha256Of(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}

func fileHeader(name string, size int) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(size), Format: tar.FormatPAX}
}

func dirHeader(name string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, Format: tar.FormatPAX}
}

// paxHeader is a PAX extended header ('x') holding records.
func paxHeader(t *testing.T, records map[string]string) []byte {
	var recs bytes.Buffer
	for _, k := range slices.Sorted(maps.Keys(records)) {
		// "<length> <key>=<value>\n", the length counting its own digits.
		rec := " " + k + "=" + records[k] + "\n"
		n := len(rec) + 1
		for len(strconv.Itoa(n))+len(rec) != n {
			n = len(strconv.Itoa(n)) + len(rec)
		}
		fmt.Fprintf(&recs, "%d%s", n, rec)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	must(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "PaxHeaders/x", Size: int64(recs.Len()), Format: tar.FormatUSTAR}))
	_, err := tw.Write(recs.Bytes())
	must(t, err)
	must(t, tw.Flush())
	raw := b.Bytes()
	raw[156] = tar.TypeXHeader
	copy(raw[148:156], "        ")
	sum := 0
	for _, c := range raw[:512] {
		sum += int(c)
	}
	copy(raw[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return raw
}

// TestGNUSparseRefused: an entry archive/tar would read as a GNU sparse
// file, all hole of 2^62 bytes in a few hundred bytes of artifact, is
// refused before its content is read (it took a core for years).
func TestGNUSparseRefused(t *testing.T) {
	art := craft(t, manifest, []crafted{
		{hdr: dirHeader(Layer)},
		{rawPAX: map[string]string{"GNU.sparse.major": "0", "GNU.sparse.minor": "1", "GNU.sparse.numblocks": "0",
			"GNU.sparse.size": strconv.FormatInt(1<<62, 10)},
			hdr: &tar.Header{Typeflag: tar.TypeReg, Name: Layer + "/zeros", Mode: 0o644, Format: tar.FormatUSTAR}},
	})
	t.Logf("artifact of %d bytes", len(art))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Walk(ctx, bytes.NewReader(art), nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "GNU sparse") {
		t.Fatalf("Walk = %v, want an invalid artifact saying GNU sparse", err)
	}
	t.Log(err)
}

// TestWalkStopsWhenItsContextEnds: Walk gives up reading an entry's
// content once its context is done, not only between entries.
func TestWalkStopsWhenItsContextEnds(t *testing.T) {
	data := make([]byte, 8<<20)
	rand.Read(data)
	art := craft(t, manifest, []crafted{
		{hdr: dirHeader(Volume)},
		{hdr: fileHeader(Volume+"/random", len(data)), body: data},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &countingSource{r: bytes.NewReader(art)}
	_, err := Walk(ctx, src, func(e *Entry, content io.Reader) error {
		if e.Rel == "random" {
			content.Read(make([]byte, 1))
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Walk = %v, want context.Canceled", err)
	}
	if src.n > int64(len(art))/2 {
		t.Errorf("Walk read %d of the %d bytes of the artifact after its context ended", src.n, len(art))
	}
}

type countingSource struct {
	r io.Reader
	n int64
}

func (c *countingSource) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// longName is a name of a section of about n bytes, unique by i, in
// components a file system takes.
func longName(section string, n, i int) string {
	return section + "/" + strings.Repeat(strings.Repeat("d", 99)+"/", n/100) + fmt.Sprintf("f%08d", i)
}

// TestLongNamesRefused: a path inside a section or a link target longer
// than any path Linux takes is refused (names of 500,000 bytes took
// memory without bound); the longest are taken.
func TestLongNamesRefused(t *testing.T) {
	path := func(n int) string { // of n bytes
		p := strings.Repeat("n/", (n-1)/2)
		return p + strings.Repeat("x", n-len(p))
	}
	symlink := func(name, target string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Format: tar.FormatPAX}
	}
	link := func(name, target string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Format: tar.FormatPAX}
	}
	for _, entries := range [][]crafted{
		{{hdr: fileHeader(longName(Volume, 500_000, 0), 0)}},
		{{hdr: fileHeader(strings.Repeat("x", 500_000), 0)}},
		{{hdr: fileHeader(Volume+"/"+path(4096), 0)}},
		{{hdr: symlink(Volume+"/link", strings.Repeat("x/", 2100))}},
		{{hdr: symlink(Volume+"/link", path(4096))}},
		{{hdr: fileHeader(Volume+"/f", 0)}, {hdr: link(Volume+"/"+path(4096), Volume+"/f")}},
	} {
		art := craft(t, manifest, append([]crafted{{hdr: dirHeader(Volume)}}, entries...))
		_, err := Walk(context.Background(), bytes.NewReader(art), nil)
		e := entries[len(entries)-1].hdr
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "over 4095 bytes") {
			t.Errorf("%c entry of %d and %d bytes of names: %v, want an invalid artifact saying over 4095 bytes",
				e.Typeflag, len(e.Name), len(e.Linkname), err)
		}
	}
	// The longest are taken: paths of 4095 bytes in the section (7 more
	// with its name), and a symbolic link's target of 4095.
	longest := Volume + "/" + path(4095)
	art := craft(t, manifest, []crafted{{hdr: dirHeader(Volume)}, {hdr: fileHeader(longest, 0)},
		{hdr: link(Volume+"/"+path(4094)+"h", longest)}, {hdr: symlink(Volume+"/link", path(4095))}})
	if _, err := Walk(context.Background(), bytes.NewReader(art), nil); err != nil {
		t.Errorf("paths and a link target of 4095 bytes: %v", err)
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// manyLongNames is an artifact of 20,000 empty files of 4,000-byte names:
// 80 MB of trailer in 2 MB.
func manyLongNames(t *testing.T) []byte {
	entries := []crafted{{hdr: dirHeader(Volume)}}
	for i := range 20_000 {
		entries = append(entries, crafted{hdr: fileHeader(longName(Volume, 3980, i), 0)})
	}
	return craft(t, manifest, entries)
}

// TestWalkHoldsNoTrailer: Walk verifies the trailer without holding the
// lines it expects, nor the trailer (it took 1.6 GB for 126 KB): what it
// holds does not grow from its 2,000th entry to its last.
func TestWalkHoldsNoTrailer(t *testing.T) {
	art := manyLongNames(t)
	var base, peak uint64
	n := 0
	_, err := Walk(context.Background(), bytes.NewReader(art), func(*Entry, io.Reader) error {
		if n++; n%2000 == 0 {
			peak = max(peak, liveHeap())
			if base == 0 {
				base = peak
			}
		}
		return nil
	})
	must(t, err)
	t.Logf("%d bytes of artifact, %d entries, at most %d bytes of heap more than at the 2,000th", len(art), n, peak-base)
	if peak > base+8<<20 {
		t.Errorf("Walk took %d MB more from its 2,000th entry to its last", (peak-base)>>20)
	}
}

// TestTrailerSizeNotAllocated: a trailer whose header claims a GiB is
// refused without allocating it.
func TestTrailerSizeNotAllocated(t *testing.T) {
	body, err := EncodeManifest(manifest)
	must(t, err)
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	must(t, tw.WriteHeader(fileHeader(ManifestName, len(body))))
	_, err = tw.Write(body)
	must(t, err)
	must(t, tw.WriteHeader(fileHeader(TrailerName, 1<<30)))
	art := zstd.EncodeTo(nil, out.Bytes())
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = Walk(context.Background(), bytes.NewReader(art), nil)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("Walk = %v, want an invalid artifact", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20 {
		t.Errorf("Walk allocated %d MB for a trailer it did not have", n>>20)
	}
}

// TestWriterHoldsNoTrailer: the Writer keeps the trailer's lines out of
// memory until Close writes them, and the trailer verifies.
func TestWriterHoldsNoTrailer(t *testing.T) {
	body, err := EncodeManifest(manifest)
	must(t, err)
	var art bytes.Buffer
	w, err := NewWriter(&art, body, nil)
	must(t, err)
	var base uint64
	for i := range 20_000 {
		if i == 2000 {
			base = liveHeap()
		}
		must(t, w.AddFile(longName(Volume, 3980, i), bytes.NewReader(nil), 0))
	}
	if held := liveHeap(); held > base+8<<20 {
		t.Errorf("the Writer took %d MB more from its 2,000th file of a 4,000-byte name to its 20,000th", (held-base)>>20)
	}
	must(t, w.Close())
	if _, err := Walk(context.Background(), bytes.NewReader(art.Bytes()), nil); err != nil {
		t.Errorf("Walk of what the Writer wrote: %v", err)
	}
}

// TestHardLinkToNoEarlierEntryRefused: a hard link must point at an
// earlier entry of its section other than a directory, which extraction
// can link to; an artifact whose link points at nothing imported, and
// could never be restored.
func TestHardLinkToNoEarlierEntryRefused(t *testing.T) {
	link := func(name, target string) crafted {
		return crafted{hdr: &tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Format: tar.FormatPAX}}
	}
	for name, entries := range map[string][]crafted{
		"a missing entry":  {link(Layer+"/l", Layer+"/missing")},
		"a directory":      {{hdr: dirHeader(Layer + "/d")}, link(Layer+"/l", Layer+"/d")},
		"a later entry":    {link(Layer+"/l", Layer+"/f"), {hdr: fileHeader(Layer+"/f", 0)}},
		"itself":           {link(Layer+"/l", Layer+"/l")},
		"another section":  {{hdr: fileHeader(Layer+"/f", 0)}, {hdr: dirHeader(Volume)}, link(Volume+"/l", Layer+"/f")},
		"the section root": {link(Layer+"/l", Layer)},
	} {
		art := craft(t, manifest, append([]crafted{{hdr: dirHeader(Layer)}}, entries...))
		if _, err := Walk(context.Background(), bytes.NewReader(art), nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("a hard link to %s: %v, want an invalid artifact", name, err)
		} else {
			t.Logf("a hard link to %s: %v", name, err)
		}
	}
	art := craft(t, manifest, []crafted{{hdr: dirHeader(Layer)}, {hdr: fileHeader(Layer+"/f", 0)},
		link(Layer+"/l", Layer+"/f"), link(Layer+"/m", Layer+"/l")})
	if _, err := Walk(context.Background(), bytes.NewReader(art), nil); err != nil {
		t.Errorf("hard links to an earlier file and an earlier link: %v", err)
	}
}

// TestSocketWithHardLinksRestores: a socket with several names is left
// out of an export whole, so the artifact restores (a hard link to it
// pointed at no entry).
func TestSocketWithHardLinksRestores(t *testing.T) {
	hosttest.RequireRoot(t)
	src := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(src, "sock"))
	must(t, err)
	defer l.Close()
	must(t, os.Link(filepath.Join(src, "sock"), filepath.Join(src, "sock2")))
	must(t, os.WriteFile(filepath.Join(src, "file"), []byte("x"), 0o644))
	art := write(t, map[string]string{Layer: src})
	dst := t.TempDir()
	if _, err := Extract(context.Background(), bytes.NewReader(art), map[string]string{Layer: dst}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	for name, want := range map[string]bool{"file": true, "sock": false, "sock2": false} {
		if _, err := os.Lstat(filepath.Join(dst, name)); (err == nil) != want {
			t.Errorf("%s restored: %v, want %v", name, err == nil, want)
		}
	}
}

// TestLostFoundOfAnotherType: a filesystem whose lost+found was not a
// directory restores into one mkfs made (its entry failed against the
// lost+found there).
func TestLostFoundOfAnotherType(t *testing.T) {
	hosttest.RequireRoot(t)
	for kind, create := range map[string]func(p string) error{
		"file":    func(p string) error { return os.WriteFile(p, []byte("not a directory"), 0o644) },
		"symlink": func(p string) error { return os.Symlink("elsewhere", p) },
		"fifo":    func(p string) error { return unix.Mkfifo(p, 0o600) },
	} {
		src := t.TempDir()
		must(t, create(filepath.Join(src, lostFound)))
		art := write(t, map[string]string{Volume: src})
		dst := t.TempDir()
		must(t, os.Mkdir(filepath.Join(dst, lostFound), 0o700))
		if _, err := Extract(context.Background(), bytes.NewReader(art), map[string]string{Volume: dst}); err != nil {
			t.Errorf("a %s lost+found: %v", kind, err)
			continue
		}
		if got, want := describe(t, dst)[lostFound], describe(t, src)[lostFound]; got != want {
			t.Errorf("a %s lost+found restored as %s, want %s", kind, got, want)
		}
	}
}
