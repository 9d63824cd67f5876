package artifact

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

var manifest = &ctrlv1.TransferManifest{
	Template:         &ctrlv1.TemplateRef{TemplateId: "base", Revision: "r1"},
	Resources:        &ctrlv1.ResourceRequest{CpuMillis: 500, MemoryBytes: 256 << 20, WritableLayerBytes: 512 << 20},
	SourceGeneration: 2,
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// makeTree builds a tree with every kind of entry the format carries.
func makeTree(t *testing.T, root string) {
	t.Helper()
	w := func(name, content string, mode os.FileMode) {
		must(t, os.WriteFile(filepath.Join(root, name), []byte(content), mode))
		must(t, os.Chmod(filepath.Join(root, name), mode))
	}
	must(t, os.MkdirAll(filepath.Join(root, "etc/deep/er"), 0o755))
	w("etc/hostname", "box\n", 0o644)
	w("etc/deep/er/secret", "s3cret", 0o600)
	w("empty", "", 0o640)
	w("setuid", "#!/bin/sh\n", 0o4755)
	must(t, os.Chown(filepath.Join(root, "etc/deep/er/secret"), 1000, 1001))
	must(t, os.Chown(filepath.Join(root, "setuid"), 0, 50))
	must(t, os.Chmod(filepath.Join(root, "setuid"), 0o4755))
	must(t, os.Symlink("../etc/hostname", filepath.Join(root, "etc/deep/link")))
	must(t, os.Symlink("/does/not/exist", filepath.Join(root, "dangling")))
	must(t, os.Link(filepath.Join(root, "etc/hostname"), filepath.Join(root, "hardlink")))
	must(t, unix.Mkfifo(filepath.Join(root, "fifo"), 0o620))
	// An overlay whiteout and an opaque directory.
	must(t, unix.Mknod(filepath.Join(root, "etc/whiteout"), unix.S_IFCHR|0o000, 0))
	must(t, os.Mkdir(filepath.Join(root, "opaque"), 0o711))
	must(t, unix.Setxattr(filepath.Join(root, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, unix.Setxattr(filepath.Join(root, "etc/hostname"), "user.note", []byte("bin\x00ary"), 0))
	must(t, unix.Setxattr(filepath.Join(root, "etc/hostname"), "trusted.overlay.origin", []byte("host-private"), 0))
	// A 1 GiB sparse file with data at its start, middle and end.
	f, err := os.Create(filepath.Join(root, "sparse"))
	must(t, err)
	must(t, f.Truncate(1<<30))
	for _, off := range []int64{0, 300 << 20, 1<<30 - 5} {
		_, err := f.WriteAt([]byte("data!"), off)
		must(t, err)
	}
	must(t, f.Close())
	// A file that is all hole.
	f, err = os.Create(filepath.Join(root, "hole"))
	must(t, err)
	must(t, f.Truncate(64<<20))
	must(t, f.Close())
	must(t, os.Chown(filepath.Join(root, "etc"), 7, 8))
}

// describe returns one line per path of the tree: type, mode, owner,
// size, content hash, link target, attributes (trusted.overlay.origin
// dropped, as the format does), modification time, and the first path of
// its hard-link group. It walks relative to directory descriptors, so
// that it reads trees whose paths, with root's, are longer than Linux
// takes.
func describe(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	inodes := map[uint64]string{}
	var walk func(dirfd int, base, rel string)
	walk = func(dirfd int, base, rel string) {
		var st unix.Stat_t
		// base "" is dirfd itself; the magic link names it for the
		// *xattr calls, which then follow it.
		proc := "/proc/self/fd/" + strconv.Itoa(dirfd)
		list, get := unix.Listxattr, unix.Getxattr
		if base == "" {
			must(t, unix.Fstat(dirfd, &st))
		} else {
			must(t, unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW))
			proc += "/" + base
			list, get = unix.Llistxattr, unix.Lgetxattr
		}
		line := fmt.Sprintf("%o %d:%d %d mtime=%d", st.Mode, st.Uid, st.Gid, st.Size, st.Mtim.Nano())
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if first, ok := inodes[st.Ino]; ok {
				line += " link=" + first
			} else {
				inodes[st.Ino] = rel
			}
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			must(t, err)
			f := os.NewFile(uintptr(fd), rel)
			line += " sha=" + contentHash(t, f, st.Size)
			f.Close()
		case unix.S_IFLNK:
			buf := make([]byte, 8192)
			n, err := unix.Readlinkat(dirfd, base, buf)
			must(t, err)
			line += " -> " + string(buf[:n])
		case unix.S_IFCHR:
			line += fmt.Sprintf(" dev=%d", st.Rdev)
		}
		buf := make([]byte, 4096)
		n, _ := list(proc, buf)
		names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
		slices.Sort(names)
		for _, name := range names {
			if name == "" || skippedXattrs[name] {
				continue
			}
			v := make([]byte, 4096)
			m, _ := get(proc, name, v)
			line += fmt.Sprintf(" %s=%q", name, v[:m])
		}
		out[rel] = line
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return
		}
		fd := dirfd
		if base != "" {
			var err error
			fd, err = unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			must(t, err)
		}
		dir := os.NewFile(uintptr(fd), rel)
		names, err := dir.Readdirnames(-1)
		must(t, err)
		for _, name := range names {
			walk(fd, name, filepath.Join(rel, name))
		}
		dir.Close()
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	walk(fd, "", ".")
	return out
}

// sameTrees reports each path whose description differs between the
// trees want and got, or that only one holds.
func sameTrees(t *testing.T, want, got string) {
	t.Helper()
	w, g := describe(t, want), describe(t, got)
	for _, k := range slices.Sorted(maps.Keys(w)) {
		if g[k] != w[k] {
			t.Errorf("%s:\n got  %s\n want %s", k, g[k], w[k])
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			t.Errorf("extra %s", k)
		}
	}
}

// write writes an artifact of manifest holding each section's tree.
func write(t *testing.T, sections map[string]string) []byte {
	t.Helper()
	return writeWith(t, manifest, func(w *Writer) {
		for _, s := range slices.Sorted(maps.Keys(sections)) {
			must(t, w.AddTree(context.Background(), s, sections[s]))
		}
	})
}

// writeWith writes an artifact of manifest m whose entries add writes.
func writeWith(t *testing.T, m *ctrlv1.TransferManifest, add func(*Writer)) []byte {
	t.Helper()
	body, err := EncodeManifest(m)
	must(t, err)
	var buf bytes.Buffer
	w, err := NewWriter(&buf, body, nil)
	must(t, err)
	add(w)
	must(t, w.Close())
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	hosttest.RequireRoot(t)
	src, vol := t.TempDir(), t.TempDir()
	makeTree(t, src)
	must(t, os.WriteFile(filepath.Join(vol, "data.bin"), bytes.Repeat([]byte("v"), 3<<20), 0o644))
	art := write(t, map[string]string{Layer: src, Volume: vol})
	if len(art) > 1<<20 {
		t.Errorf("artifact of a tree with a 1 GiB sparse file and 3 MiB of repeated bytes is %d bytes", len(art))
	}
	dstLayer, dstVol := t.TempDir(), t.TempDir()
	m, err := Extract(context.Background(), bytes.NewReader(art), map[string]string{Layer: dstLayer, Volume: dstVol})
	must(t, err)
	if !proto.Equal(m, manifest) {
		t.Errorf("manifest = %v, want %v", m, manifest)
	}
	sameTrees(t, src, dstLayer)
	sameTrees(t, vol, dstVol)
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(dstLayer, "sparse"), &st))
	if st.Blocks*512 > 1<<20 {
		t.Errorf("restored sparse file allocates %d bytes: its holes were filled", st.Blocks*512)
	}
	if v := make([]byte, 64); true {
		if _, err := unix.Lgetxattr(filepath.Join(dstLayer, "etc/hostname"), "trusted.overlay.origin", v); !errors.Is(err, unix.ENODATA) {
			t.Errorf("trusted.overlay.origin was carried: %v", err)
		}
	}
}

// longPrefix is a new directory below a prefix of over 240 bytes, like
// the host's mounts of a layer or Volume but longer.
func longPrefix(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), strings.Repeat("p", 120), strings.Repeat("q", 120))
	must(t, os.MkdirAll(dir, 0o755))
	return dir
}

// deepDir is a path of 20 directories of 199 bytes and one of 40: 4,040
// bytes, from which a name of 54 bytes makes a path of 4,095, the
// longest Linux takes.
var deepDir = strings.Repeat(strings.Repeat("0", 199)+"/", 20) + strings.Repeat("e", 40)

// makeDeepTree builds below root, through os.Root (whose calls are
// relative to directory descriptors), a tree whose deepest paths are
// 4,095 bytes long, of every kind of entry the format carries, and
// returns the name of its deepest directory, which holds them.
func makeDeepTree(t *testing.T, root string) string {
	t.Helper()
	r, err := os.OpenRoot(root)
	must(t, err)
	defer r.Close()
	must(t, r.MkdirAll(deepDir, 0o755))
	at := func(c string) string { return deepDir + "/" + strings.Repeat(c, 54) }
	file, sparse := at("f"), at("s")
	must(t, r.WriteFile(file, []byte("deeper\n"), 0o600))
	must(t, r.Lchown(file, 1000, 1001))
	must(t, r.Link(file, at("h")))
	// A target of 4,095 bytes, the longest symlink(2) takes.
	must(t, r.Symlink(strings.Repeat("../", 1365), at("l")))
	f, err := r.Create(sparse)
	must(t, err)
	must(t, f.Truncate(64<<20))
	_, err = f.WriteAt([]byte("data!"), 32<<20)
	must(t, err)
	must(t, unix.Fsetxattr(int(f.Fd()), "user.note", []byte("deep"), 0))
	must(t, f.Close())
	d, err := r.Open(deepDir)
	must(t, err)
	defer d.Close()
	dirfd := int(d.Fd())
	must(t, unix.Mknodat(dirfd, strings.Repeat("p", 54), unix.S_IFIFO|0o620, 0))
	must(t, unix.Mknodat(dirfd, strings.Repeat("w", 54), unix.S_IFCHR, 0)) // a whiteout
	must(t, unix.Fsetxattr(dirfd, "trusted.overlay.opaque", []byte("y"), 0))
	must(t, unix.Fchown(dirfd, 7, 8))
	must(t, unix.Fchmod(dirfd, 0o711))
	return deepDir
}

// TestLongPathsRoundTrip: a tree whose paths are as long as Linux takes,
// below a root whose own path is long, is exported and restored whole:
// the writer and the extractor work relative to the tree's root, so the
// host's directories take nothing from the guest's paths.
func TestLongPathsRoundTrip(t *testing.T) {
	hosttest.RequireRoot(t)
	src := longPrefix(t)
	makeDeepTree(t, src)
	art := write(t, map[string]string{Layer: src, Volume: src})
	dstLayer, dstVol := longPrefix(t), longPrefix(t)
	_, err := Extract(context.Background(), bytes.NewReader(art), map[string]string{Layer: dstLayer, Volume: dstVol})
	must(t, err)
	want := describe(t, src)
	if deepest := slices.MaxFunc(slices.Collect(maps.Keys(want)), func(a, b string) int { return len(a) - len(b) }); len(deepest) != 4095 {
		t.Fatalf("the deepest path of the tree is %d bytes, not 4095", len(deepest))
	}
	sameTrees(t, src, dstLayer)
	sameTrees(t, src, dstVol)
}

// TestPathLongerThanLinuxTakesRefused: a path of the tree longer than
// Linux takes in one call (which a guest makes only by working in
// relative paths) is refused, saying which, before its entry is written.
func TestPathLongerThanLinuxTakesRefused(t *testing.T) {
	hosttest.RequireRoot(t)
	src := longPrefix(t)
	r, err := os.OpenRoot(src)
	must(t, err)
	defer r.Close()
	must(t, r.MkdirAll(deepDir, 0o755))
	long := deepDir + "/" + strings.Repeat("g", 55)
	must(t, r.WriteFile(long, nil, 0o644))
	body, err := EncodeManifest(manifest)
	must(t, err)
	w, err := NewWriter(io.Discard, body, nil)
	must(t, err)
	defer w.Close()
	before := w.entries
	err = w.AddTree(context.Background(), Layer, src)
	if !errors.Is(err, unix.ENAMETOOLONG) || !strings.Contains(err.Error(), "a path of 4096 bytes") || !strings.Contains(err.Error(), "/ggggg") {
		t.Fatalf("AddTree of a tree with a path of 4096 bytes: %v, want ENAMETOOLONG naming it", err)
	}
	t.Log(err)
	if added := w.entries - before; added != 22 {
		t.Errorf("%d entries were written, want the root and the 21 directories above the path", added)
	}
}

// TestExtractOnlyNamedSections leaves out the sections roots does not
// name, but still verifies them.
func TestExtractOnlyNamedSections(t *testing.T) {
	hosttest.RequireRoot(t)
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644))
	art := write(t, map[string]string{Layer: src, Volume: src})
	dst := t.TempDir()
	_, err := Extract(context.Background(), bytes.NewReader(art), map[string]string{Volume: dst})
	must(t, err)
	if _, err := os.Stat(filepath.Join(dst, "f")); err != nil {
		t.Error(err)
	}
	art[len(art)/2] ^= 0xff
	if _, err := Extract(context.Background(), bytes.NewReader(art), map[string]string{Volume: t.TempDir()}); !errors.Is(err, ErrInvalid) {
		t.Errorf("corrupted section left out: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	hosttest.RequireRoot(t)
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte("0123456789abcdef"), 1<<16), 0o644))
	good := write(t, map[string]string{Layer: src})
	zstdOf := func(b []byte) []byte {
		var buf bytes.Buffer
		zw, _ := zstd.NewWriter(&buf)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	var gz bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write([]byte("hello"))
	gw.Close()
	flip := func(at int) []byte {
		b := slices.Clone(good)
		b[at] ^= 0x01
		return b
	}
	// A flipped byte in a block's size reads as a cut: either is right.
	// One in the first entry's header decodes until the frame's checksum,
	// so it may read as a foreign archive, which the refusal also names.
	foreign, truncated, damaged := "not a Kibotos transfer artifact", "truncated", "damaged|truncated"
	cases := []struct {
		name string
		b    []byte
		says string
	}{
		{"empty", nil, foreign},
		{"gzip", gz.Bytes(), foreign},
		{"zstd of text", zstdOf([]byte("not a tar archive at all, just words")), foreign},
		{"truncated at half", good[:len(good)/2], truncated},
		{"truncated by one byte", good[:len(good)-1], truncated},
		{"one byte flipped", flip(len(good) / 2), damaged},
		{"first frame flipped", flip(40), damaged},
		{"data after the end", append(slices.Clone(good), zstdOf([]byte("more"))...), "follows its end"},
	}
	for _, c := range cases {
		_, err := Walk(context.Background(), bytes.NewReader(c.b), nil)
		if !errors.Is(err, ErrInvalid) || !slices.ContainsFunc(strings.Split(c.says, "|"), func(s string) bool { return strings.Contains(err.Error(), s) }) {
			t.Errorf("%s: %v, want an invalid artifact saying %q", c.name, err, c.says)
			continue
		}
		t.Logf("%s: %v", c.name, err)
	}
	if _, err := Walk(context.Background(), bytes.NewReader(good), nil); err != nil {
		t.Errorf("good artifact: %v", err)
	}
	// An error of the source is the source's, not the artifact's.
	boom := errors.New("connection reset")
	if _, err := Walk(context.Background(), io.MultiReader(bytes.NewReader(good[:100]), iotestErr{boom}), nil); !errors.Is(err, boom) {
		t.Errorf("source error: %v", err)
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// TestEscapes refuses archives whose entries would land outside the
// directory they are extracted into.
func TestEscapes(t *testing.T) {
	hosttest.RequireRoot(t)
	outside := t.TempDir()
	src := t.TempDir()
	// A symbolic link to outside, then a file through it: built by hand,
	// since a real tree cannot hold both.
	must(t, os.Symlink(outside, filepath.Join(src, "escape")))
	evil := writeWith(t, manifest, func(w *Writer) {
		must(t, w.AddTree(context.Background(), Layer, src))
		must(t, w.AddFile(Layer+"/escape/pwned", strings.NewReader("x"), 1))
	})
	_, err := Extract(context.Background(), bytes.NewReader(evil), map[string]string{Layer: t.TempDir()})
	if err == nil {
		t.Fatal("an entry through a symbolic link was extracted")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("written outside: %v", ents)
	}
}

// contentHash hashes a file's content by its data extents and their
// offsets: equal for equal content and holes, without reading holes.
func contentHash(t *testing.T, f *os.File, size int64) string {
	extents, err := dataExtents(f, size)
	must(t, err)
	h := sha256.New()
	for _, e := range extents {
		fmt.Fprintf(h, "%d,%d:", e[0], e[1])
		_, err := io.Copy(h, io.NewSectionReader(f, e[0], e[1]))
		must(t, err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// TestFilesystems: the layouts WithFilesystems adds to the manifest are
// what Filesystems reads back from the artifact's start alone (the rest
// unread), and the artifact still walks and says the same manifest; an
// artifact without them gives none, and a foreign file is invalid.
func TestFilesystems(t *testing.T) {
	layouts := map[string]json.RawMessage{Layer: json.RawMessage(`{"block_size":1024}`), Volume: json.RawMessage(`{"block_size":4096}`)}
	body, err := EncodeManifest(manifest)
	must(t, err)
	body, err = WithFilesystems(body, layouts)
	must(t, err)
	var buf bytes.Buffer
	w, err := NewWriter(&buf, body, nil)
	must(t, err)
	vol := t.TempDir()
	data := make([]byte, 4<<20)
	rand.Read(data)
	must(t, os.WriteFile(filepath.Join(vol, "data.bin"), data, 0o644))
	must(t, w.AddTree(context.Background(), Volume, vol))
	must(t, w.Close())
	art := buf.Bytes()

	// Only the start: Filesystems must not need the rest (whose
	// compressed blocks, random data, end at the artifact's end).
	got, err := Filesystems(bytes.NewReader(art[:len(art)/2]))
	must(t, err)
	if len(got) != 2 || string(got[Layer]) != `{"block_size":1024}` || string(got[Volume]) != `{"block_size":4096}` {
		t.Errorf("Filesystems = %s", got)
	}
	if m, err := Walk(context.Background(), bytes.NewReader(art), nil); err != nil || !proto.Equal(m, manifest) {
		t.Errorf("Walk of an artifact with layouts: %v, %v", m, err)
	}

	if got, err := Filesystems(bytes.NewReader(write(t, nil))); err != nil || got != nil {
		t.Errorf("Filesystems of an artifact without layouts = %s, %v", got, err)
	}
	if _, err := Filesystems(strings.NewReader("PK\x03\x04 a zip file")); !errors.Is(err, ErrInvalid) {
		t.Errorf("Filesystems of a zip file: %v", err)
	}
	if _, err := WithFilesystems([]byte(`{"format":"another"}`), layouts); !errors.Is(err, ErrInvalid) {
		t.Errorf("WithFilesystems of another format's manifest: %v", err)
	}
}
