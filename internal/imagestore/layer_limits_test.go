package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// gnuSparseEntry is a tar entry in the old GNU sparse format (type 'S'): a file
// of realSize bytes whose only data is data at offset 0, the rest a hole.
func gnuSparseEntry(name string, data []byte, realSize int64) []byte {
	h := make([]byte, 512)
	copy(h, name)
	octal := func(b []byte, v int64) { copy(b, fmt.Sprintf("%0*o", len(b)-1, v)) }
	octal(h[100:108], 0o644)
	octal(h[108:116], 0)
	octal(h[116:124], 0)
	octal(h[124:136], int64(len(data))) // the data stored in the archive
	octal(h[136:148], mtime.Unix())
	h[156] = 'S'
	copy(h[257:265], "ustar  \x00")
	octal(h[386:398], 0)                // sparse[0].offset
	octal(h[398:410], int64(len(data))) // sparse[0].numbytes
	octal(h[483:495], realSize)
	copy(h[148:156], "        ")
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	body := make([]byte, (len(data)+511)/512*512)
	copy(body, data)
	return append(h, body...)
}

// rawLayer is an uncompressed layer of the given tar bytes (end blocks added).
func rawLayerImage(t *testing.T, entries ...[]byte) []byte {
	t.Helper()
	data := append(bytes.Join(entries, nil), make([]byte, 1024)...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return writeArchive(t, testImage(t, "amd64", l))
}

// tarHeader is one tar entry written by archive/tar, with its content.
func tarHeader(t *testing.T, hdr tar.Header, body io.Reader) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr.ModTime = mtime
	if err := tw.WriteHeader(&hdr); err != nil {
		t.Fatal(err)
	}
	if body != nil {
		if _, err := io.Copy(tw, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// diskBytes is what a file takes on disk.
func diskBytes(t *testing.T, p string) (size, allocated int64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Size, st.Blocks * 512
}

// TestUnpackKeepsHoles: a sparse 1 GiB tar entry and a file of 16 MiB of zeros
// take (almost) no host disk once unpacked, and read back as written.
func TestUnpackKeepsHoles(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	const zeros = 16 << 20
	archive := rawLayerImage(t,
		gnuSparseEntry("sparse", []byte("data before the hole"), 1<<30),
		tarHeader(t, tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Mode: 0o644, Size: zeros + 5},
			io.MultiReader(io.LimitReader(zeroReader{}, zeros), strings.NewReader("tail!"))),
	)
	img, err := s.ImportArchive(ctx, bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := s.Unpack(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name string
		size int64
		head string
		tail string
	}{{"sparse", 1 << 30, "data before the hole", "\x00"}, {"zeros", zeros + 5, "\x00", "tail!"}} {
		p := filepath.Join(dirs[0], f.name)
		size, alloc := diskBytes(t, p)
		if size != f.size || alloc > 1<<20 {
			t.Errorf("%s: size %d (want %d), %d bytes on disk (want at most 1 MiB)", f.name, size, f.size, alloc)
		}
		fh, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, len(f.head))
		tail := make([]byte, len(f.tail))
		fh.ReadAt(head, 0)
		fh.ReadAt(tail, size-int64(len(tail)))
		fh.Close()
		if string(head) != f.head || string(tail) != f.tail {
			t.Errorf("%s: starts %q ends %q, want %q and %q", f.name, head, tail, f.head, f.tail)
		}
	}
	if n, err := s.UnpackedBytes(img); err != nil || n != 1<<30+zeros+5 {
		t.Errorf("UnpackedBytes = %d, %v", n, err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestLayerSizeLimit: a layer whose files hold more than the limit (a sparse
// file counts at its full size) is refused at import and at unpack, leaving
// nothing behind.
func TestLayerSizeLimit(t *testing.T) {
	ctx := context.Background()
	archive := rawLayerImage(t, gnuSparseEntry("big", []byte("x"), 2<<20))

	s := openStore(t)
	s.SetMaxLayerBytes(1 << 20)
	_, err := s.ImportArchive(ctx, bytes.NewReader(archive))
	if !errors.Is(err, ErrLayerTooLarge) || !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "1048576 bytes") {
		t.Fatalf("import over the limit: %v, want ErrLayerTooLarge naming the limit", err)
	}
	assertClean(t, s)

	// A host with a smaller limit than the importer's refuses to unpack it.
	s.SetMaxLayerBytes(0)
	img, err := s.ImportArchive(ctx, bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	s.SetMaxLayerBytes(1 << 20)
	if _, err := s.Unpack(ctx, img, nil); !errors.Is(err, ErrLayerTooLarge) {
		t.Fatalf("unpack over the limit: %v, want ErrLayerTooLarge", err)
	}
	if names := dirEntries(t, s.layerDir()); len(names) != 0 {
		t.Errorf("layers after a refused unpack: %v", names)
	}
	if names := dirEntries(t, s.tmpDir()); len(names) != 0 {
		t.Errorf("tmp after a refused unpack: %v", names)
	}
}

// TestDeviceNodesRefused: character and block devices are refused at import
// and, for a blob that reached a host anyway, at unpack; a fifo is fine.
func TestDeviceNodesRefused(t *testing.T) {
	ctx := context.Background()
	for _, typ := range []byte{tar.TypeChar, tar.TypeBlock} {
		dev := tarHeader(t, tar.Header{Typeflag: typ, Name: "dev/sda", Mode: 0o666, Devmajor: 8, Devminor: 0}, nil)
		archive := rawLayerImage(t, dev)
		s := openStore(t)
		if _, err := s.ImportArchive(ctx, bytes.NewReader(archive)); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "device node") {
			t.Errorf("import of a %q entry: %v, want invalid image naming the device node", typ, err)
		}
		assertClean(t, s)

		// The same layer as a blob a host fetched.
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(append(dev, make([]byte, 1024)...))), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		digest, _ := l.Digest()
		diffID, _ := l.DiffID()
		rc, _ := l.Compressed()
		if err := s.PutBlob(digest.String(), rc); err != nil {
			t.Fatal(err)
		}
		_, err = s.Unpack(ctx, Image{Layers: []Layer{{Digest: digest.String(), DiffID: diffID.String()}}}, nil)
		if !errors.Is(err, ErrInvalidImage) {
			t.Errorf("unpack of a %q entry: %v, want invalid image", typ, err)
		}
		if names := dirEntries(t, s.layerDir()); len(names) != 0 {
			t.Errorf("layers after a refused unpack: %v", names)
		}
	}
}

// TestSparseArchiveEntriesRefused: an image archive or OCI layout tar with a
// sparse entry (1 TiB declared in a few KiB) is refused before its holes are
// read, storing nothing.
func TestSparseArchiveEntriesRefused(t *testing.T) {
	ctx := context.Background()
	sparse := append(gnuSparseEntry("blobs/sha256/big", []byte("x"), 1<<40), make([]byte, 1024)...)
	s := openStore(t)
	if _, err := s.ImportArchive(ctx, bytes.NewReader(sparse)); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "sparse") {
		t.Errorf("archive with a sparse entry: %v", err)
	}
	assertClean(t, s)
	if _, err := s.ImportOCILayoutTar(ctx, bytes.NewReader(sparse)); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "sparse") {
		t.Errorf("layout tar with a sparse entry: %v", err)
	}
	assertClean(t, s)
}

// TestUnrunnableImagesRefused: an image no workspace could run is refused
// at import, saying why, and nothing is stored: no layer, more layers than
// a root stacks, an environment entry runc refuses, an environment too
// large to give every process (and keep in every workspace's record).
func TestUnrunnableImagesRefused(t *testing.T) {
	ctx := context.Background()
	withEnv := func(env ...string) v1.Image {
		img := testImage(t, "amd64", tarLayer(t, fileE("f", "x")))
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.Config.Env = env
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		return img
	}
	var many []v1.Layer
	for i := range MaxLayers + 1 {
		many = append(many, tarLayer(t, fileE(fmt.Sprintf("f%d", i), "x")))
	}
	big := strings.Repeat("v", 64<<10)
	for _, c := range []struct {
		name, says string
		img        v1.Image
	}{
		{"no layer", "no layer", testImage(t, "amd64")},
		{"too many layers", "201 layers", testImage(t, "amd64", many...)},
		{"an entry without =", "Env[1]", withEnv("A=b", "NOEQUALS")},
		{"an entry without a name", "Env[0]", withEnv("=x")},
		{"an entry with a NUL byte", "Env[0]", withEnv("A=b\x00c")},
		{"an environment too large", "Env is", withEnv("A="+big, "B="+big, "C=c")},
	} {
		s := openStore(t)
		if _, err := s.ImportImage(ctx, c.img); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want invalid image saying %q", c.name, err, c.says)
		}
		assertClean(t, s)
	}
	if _, err := openStore(t).ImportImage(ctx, withEnv("A=", "PATH=/bin:/usr/bin", "B="+big)); err != nil {
		t.Errorf("an image with an empty value and 64 KiB of Env: %v", err)
	}
}

// TestEntriesCountAgainstTheLimit: a layer of empty directories, which
// take a block each on the host, is held to the layer limit as files are:
// 400 directories (1.6 MB on disk) exceed a 1 MiB limit.
func TestEntriesCountAgainstTheLimit(t *testing.T) {
	var entries []tarEntry
	for i := range 400 {
		entries = append(entries, dirE(fmt.Sprintf("d%03d/", i), 0o755))
	}
	s := openStore(t)
	s.SetMaxLayerBytes(1 << 20)
	if _, err := s.ImportImage(context.Background(), testImage(t, "amd64", tarLayer(t, entries...))); !errors.Is(err, ErrLayerTooLarge) {
		t.Errorf("400 directories under a 1 MiB limit: %v, want ErrLayerTooLarge", err)
	}
	assertClean(t, s)
}

// TestOwnersAreIDs: an entry whose owner is no user or group ID (beyond
// 32 bits, or negative, which chown would take for another) is refused.
func TestOwnersAreIDs(t *testing.T) {
	for _, owner := range [][2]int{{1 << 32, 0}, {0, 1<<32 + 1000}, {-5, 0}} {
		hdr := tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, Uid: owner[0], Gid: owner[1]}
		s := openStore(t)
		_, err := s.ImportImage(context.Background(), testImage(t, "amd64", tarLayer(t, tarEntry{hdr: hdr})))
		if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "not a user and group ID") {
			t.Errorf("owner %d:%d: %v, want it refused", owner[0], owner[1], err)
		}
		assertClean(t, s)
	}
}

// withManifest is an image whose manifest is raw.
type withManifest struct {
	v1.Image
	raw []byte
}

func (w withManifest) RawManifest() ([]byte, error) { return w.raw, nil }

func (w withManifest) Manifest() (*v1.Manifest, error) {
	return v1.ParseManifest(bytes.NewReader(w.raw))
}

// TestNegativeLayerSizeRefused: a manifest that gives a layer a negative
// size (which would skip the check of its size) is refused.
func TestNegativeLayerSizeRefused(t *testing.T) {
	img := testImage(t, "amd64", tarLayer(t, fileE("f", "x")))
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	m = m.DeepCopy()
	m.Layers[0].Size = -1
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	if _, err := s.ImportImage(context.Background(), withManifest{img, raw}); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "size -1") {
		t.Errorf("a layer of size -1: %v, want it refused", err)
	}
	assertClean(t, s)
}
