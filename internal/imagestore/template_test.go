package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

var mtime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// tarLayer builds a gzip layer from tar headers; regular files get body as content.
func tarLayer(t *testing.T, entries ...tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.ModTime.IsZero() {
			h.ModTime = mtime
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type tarEntry struct {
	hdr  tar.Header
	body []byte
}

func dirE(name string, mode int64) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}
func fileE(name, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644}, body: []byte(body)}
}

// testImage builds a linux image from layers, for arch.
func testImage(t *testing.T, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"A=b"}
	cf.Config.Entrypoint = []string{"/bin/app"}
	cf.Config.Cmd = []string{"serve"}
	cf.Config.WorkingDir = "/srv"
	cf.Config.User = "1000:1000"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// twoLayerImage: layer 2 deletes etc/gone (".wh.") and makes data/ opaque.
func twoLayerImage(t *testing.T) v1.Image {
	setuid := tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "bin/app", Mode: 0o4755, Uid: 1000, Gid: 1001}, body: []byte("#!/bin/sh\n")}
	l1 := tarLayer(t,
		dirE("./", 0o755),
		dirE("bin/", 0o755), setuid,
		dirE("etc/", 0o750),
		fileE("etc/keep", "keep"),
		fileE("etc/gone", "gone"),
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "etc/hard", Linkname: "etc/keep"}},
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "lnk", Linkname: "/etc/keep"}},
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o600}},
		dirE("data/", 0o755),
		fileE("data/old", "old"),
	)
	l2 := tarLayer(t,
		dirE("etc/", 0o750),
		fileE("etc/.wh.gone", ""),
		dirE("data/", 0o755),
		fileE("data/.wh..wh..opq", ""),
		fileE("data/new", "new"),
	)
	return testImage(t, "amd64", l1, l2)
}

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeArchive(t *testing.T, img v1.Image) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tarball.Write(name.MustParseReference("kibotos.test/two:latest"), img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// dirEntries lists the names in dir (none if it is missing).
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// assertClean checks that a failed import or unpack left nothing behind.
func assertClean(t *testing.T, s *Store) {
	t.Helper()
	for _, d := range []string{s.blobDir(), s.layerDir(), s.tmpDir()} {
		if names := dirEntries(t, d); len(names) != 0 {
			t.Errorf("%s not empty after failure: %v", d, names)
		}
	}
}

func TestBuiltinImage(t *testing.T) {
	if _, err := os.Stat(DefaultBusybox); err != nil {
		t.Skipf("no busybox: %v", err)
	}
	ctx := context.Background()
	a, err := BuiltinImage(DefaultBusybox)
	if err != nil {
		t.Fatal(err)
	}
	b, err := BuiltinImage(DefaultBusybox)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Fatalf("builtin image not deterministic: %s vs %s", da, db)
	}

	s := openStore(t)
	img, err := s.ImportImage(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if img.ManifestDigest != da.String() || len(img.Layers) != 1 {
		t.Fatalf("imported %+v, want digest %s and 1 layer", img, da)
	}
	if !slices.Equal(img.Config.Cmd, []string{"/bin/sh"}) || !slices.Contains(img.Config.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Errorf("config %+v", img.Config)
	}
	if rev := Revision(img.ManifestDigest); rev != "sha256-"+da.Hex[:16] {
		t.Errorf("Revision = %q", rev)
	}

	var calls [][2]uint64
	dirs, err := s.Unpack(ctx, img, func(d, total uint64) { calls = append(calls, [2]uint64{d, total}) })
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 1 {
		t.Fatalf("dirs = %v", dirs)
	}
	last := calls[len(calls)-1]
	if last[0] != last[1] || last[1] != uint64(img.Layers[0].Size) {
		t.Errorf("last progress %v, want delivered = total = %d", last, img.Layers[0].Size)
	}
	root := dirs[0]
	fi, err := os.Stat(filepath.Join(root, "bin/busybox"))
	if err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("bin/busybox: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q, %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&fs.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp: %v %v", fi, err)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.HasPrefix(string(passwd), "root:x:0:0:root:/root:/bin/sh\n") {
		t.Errorf("etc/passwd = %q", passwd)
	}
	if out, err := exec.Command(filepath.Join(root, "bin/busybox"), "echo", "hi").Output(); err != nil || string(out) != "hi\n" {
		t.Errorf("unpacked busybox echo: %q %v", out, err)
	}
	n, err := s.UnpackedBytes(img)
	if err != nil || n < uint64(fi.Size()) {
		t.Errorf("UnpackedBytes = %d, %v", n, err)
	}

	// A second Unpack finds the layer present.
	calls = nil
	again, err := s.Unpack(ctx, img, func(d, total uint64) { calls = append(calls, [2]uint64{d, total}) })
	if err != nil || !slices.Equal(again, dirs) {
		t.Fatalf("second Unpack = %v, %v", again, err)
	}
	for _, c := range calls {
		if c[1] != 0 {
			t.Errorf("second Unpack reported work: %v", calls)
		}
	}
}

func TestArchiveWhiteoutsAndMetadata(t *testing.T) {
	ctx := context.Background()
	src := twoLayerImage(t)
	s := openStore(t)
	img, err := s.ImportArchive(ctx, bytes.NewReader(writeArchive(t, src)))
	if err != nil {
		t.Fatal(err)
	}
	if want := (ImageConfig{Env: []string{"A=b"}, Entrypoint: []string{"/bin/app"}, Cmd: []string{"serve"}, WorkingDir: "/srv", User: "1000:1000"}); !equalConfig(img.Config, want) {
		t.Errorf("config %+v, want %+v", img.Config, want)
	}
	back, err := s.Image(img.ManifestDigest)
	if err != nil || back.ConfigDigest != img.ConfigDigest || !slices.Equal(back.Layers, img.Layers) {
		t.Fatalf("Image() = %+v, %v; want %+v", back, err, img)
	}
	dirs, err := s.Unpack(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 2 {
		t.Fatalf("dirs = %v", dirs)
	}
	lower, upper := dirs[0], dirs[1]

	// Layer 2: the whiteout is a 0/0 char device, data/ is opaque.
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "etc/gone"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/gone: mode %o rdev %d, want a 0/0 char device", st.Mode, st.Rdev)
	}
	if _, err := os.Lstat(filepath.Join(upper, "etc/.wh.gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf(".wh.gone left in layer: %v", err)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(upper, "data"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("data opaque xattr = %q, %v", buf[:n], err)
	}
	if _, err := os.Lstat(filepath.Join(upper, "data/.wh..wh..opq")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("opaque marker left in layer: %v", err)
	}

	// Layer 1: ownership, set-uid mode, links, devices and times survive.
	if err := unix.Lstat(filepath.Join(lower, "bin/app"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o4755 {
		t.Errorf("bin/app: uid %d gid %d mode %o", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if st.Mtim.Sec != mtime.Unix() {
		t.Errorf("bin/app mtime %d, want %d", st.Mtim.Sec, mtime.Unix())
	}
	fi, _ := os.Stat(filepath.Join(lower, "etc"))
	if fi.Mode().Perm() != 0o750 || !fi.ModTime().Equal(mtime) {
		t.Errorf("etc: %v %v", fi.Mode(), fi.ModTime())
	}
	if target, _ := os.Readlink(filepath.Join(lower, "lnk")); target != "/etc/keep" {
		t.Errorf("lnk -> %q", target)
	}
	var keep, hard unix.Stat_t
	unix.Lstat(filepath.Join(lower, "etc/keep"), &keep)
	unix.Lstat(filepath.Join(lower, "etc/hard"), &hard)
	if keep.Ino == 0 || keep.Ino != hard.Ino {
		t.Errorf("etc/hard is not a hard link of etc/keep")
	}
	if err := unix.Lstat(filepath.Join(lower, "run/fifo"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("run/fifo: mode %o, %v", st.Mode, err)
	}
	if fi, err := os.Stat(lower); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("layer root: %v %v", fi, err)
	}

	// The merged view through real overlayfs.
	merged := t.TempDir()
	opts := "lowerdir=" + upper + ":" + lower
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_RDONLY, opts); err != nil {
		t.Logf("overlay mount unavailable, merged view not checked: %v", err)
		return
	}
	defer unix.Unmount(merged, unix.MNT_DETACH)
	if got := dirEntries(t, filepath.Join(merged, "data")); !slices.Equal(got, []string{"new"}) {
		t.Errorf("merged data/ = %v, want [new]", got)
	}
	if got := dirEntries(t, filepath.Join(merged, "etc")); !slices.Equal(got, []string{"hard", "keep"}) {
		t.Errorf("merged etc/ = %v, want [hard keep]", got)
	}
}

func equalConfig(a, b ImageConfig) bool {
	return slices.Equal(a.Env, b.Env) && slices.Equal(a.Entrypoint, b.Entrypoint) && slices.Equal(a.Cmd, b.Cmd) &&
		a.WorkingDir == b.WorkingDir && a.User == b.User
}

// tarDir tars the files under dir, named relative to it.
func tarDir(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// The same image through an archive and an OCI layout. tarball.Write keeps the
// compressed layers and the config, and tarball.Image rebuilds the manifest from them;
// for an image with Docker media types (as here) the manifest comes out byte-identical,
// so the digests match. (An OCI-typed image would come back from an archive with a
// Docker manifest, so a different digest but the same config, layers and DiffIDs.)
func TestOCILayoutTarMatchesArchive(t *testing.T) {
	ctx := context.Background()
	src := twoLayerImage(t)
	s := openStore(t)
	fromArchive, err := s.ImportArchive(ctx, bytes.NewReader(writeArchive(t, src)))
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(src, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}
	// An arm64 sibling must be skipped.
	arm := testImage(t, "arm64", tarLayer(t, fileE("arm", "arm")))
	if err := p.AppendImage(arm, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "arm64"})); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t)
	fromLayout, err := s2.ImportOCILayoutTar(ctx, bytes.NewReader(tarDir(t, dir)))
	if err != nil {
		t.Fatal(err)
	}
	if fromLayout.ManifestDigest != fromArchive.ManifestDigest {
		t.Errorf("manifest digests differ: layout %s, archive %s", fromLayout.ManifestDigest, fromArchive.ManifestDigest)
	}
	if fromLayout.ConfigDigest != fromArchive.ConfigDigest || !slices.Equal(fromLayout.Layers, fromArchive.Layers) {
		t.Errorf("layout %+v, archive %+v", fromLayout, fromArchive)
	}
	if names := dirEntries(t, s2.tmpDir()); len(names) != 0 {
		t.Errorf("tmp not cleaned: %v", names)
	}

	// The layout directory itself, as ImportLayoutDir sees it.
	fromDir, err := openStore(t).ImportLayoutDir(ctx, dir)
	if err != nil || fromDir.ManifestDigest != fromLayout.ManifestDigest {
		t.Errorf("ImportLayoutDir = %s, %v", fromDir.ManifestDigest, err)
	}
}

func TestCorruptArchiveLeavesNothing(t *testing.T) {
	ctx := context.Background()
	good := writeArchive(t, twoLayerImage(t))

	t.Run("truncated", func(t *testing.T) {
		s := openStore(t)
		_, err := s.ImportArchive(ctx, bytes.NewReader(good[:len(good)/2]))
		if !errors.Is(err, ErrInvalidImage) {
			t.Fatalf("err = %v, want ErrInvalidImage", err)
		}
		t.Log(err)
		assertClean(t, s)
	})

	t.Run("corrupt layer", func(t *testing.T) {
		// Flip a byte in the middle of the last layer: the archive's manifest.json
		// still names it, but it no longer decompresses to its DiffID.
		var out bytes.Buffer
		tr, tw := tar.NewReader(bytes.NewReader(good)), tar.NewWriter(&out)
		var corrupted bool
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(tr)
			if strings.HasSuffix(hdr.Name, ".tar.gz") && !corrupted && len(body) > 40 {
				body[len(body)/2] ^= 0xff
				corrupted = true
			}
			tw.WriteHeader(hdr)
			tw.Write(body)
		}
		tw.Close()
		if !corrupted {
			t.Fatal("no layer in archive")
		}
		s := openStore(t)
		_, err := s.ImportArchive(ctx, &out)
		if err == nil {
			t.Fatal("corrupt layer imported")
		}
		t.Log(err)
		assertClean(t, s)
	})

	t.Run("two images", func(t *testing.T) {
		other := testImage(t, "amd64", tarLayer(t, fileE("x", "x")))
		var buf bytes.Buffer
		err := tarball.MultiRefWrite(map[name.Reference]v1.Image{
			name.MustParseReference("kibotos.test/a:1"): twoLayerImage(t),
			name.MustParseReference("kibotos.test/b:1"): other,
		}, &buf)
		if err != nil {
			t.Fatal(err)
		}
		s := openStore(t)
		_, err = s.ImportArchive(ctx, &buf)
		if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "2 images") {
			t.Fatalf("err = %v, want 2 images refused", err)
		}
		assertClean(t, s)
	})

	t.Run("arm64", func(t *testing.T) {
		s := openStore(t)
		arm := testImage(t, "arm64", tarLayer(t, fileE("x", "x")))
		_, err := s.ImportArchive(ctx, bytes.NewReader(writeArchive(t, arm)))
		if !errors.Is(err, ErrUnsupportedPlatform) || !strings.Contains(err.Error(), "linux/arm64") {
			t.Fatalf("err = %v, want linux/arm64 refused", err)
		}
		assertClean(t, s)
	})
}

func TestEscapesRefused(t *testing.T) {
	ctx := context.Background()

	t.Run("layout tar ../evil", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "../evil", Mode: 0o644, Size: 4})
		tw.Write([]byte("evil"))
		tw.Close()
		s := openStore(t)
		_, err := s.ImportOCILayoutTar(ctx, &buf)
		if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "escapes") {
			t.Fatalf("err = %v, want escape refused", err)
		}
		if _, err := os.Stat(filepath.Join(s.Dir(), "evil")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("evil written: %v", err)
		}
		assertClean(t, s)
	})

	t.Run("layout tar symlink", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "blobs", Linkname: "/etc"})
		tw.Close()
		_, err := openStore(t).ImportOCILayoutTar(ctx, &buf)
		if !errors.Is(err, ErrInvalidImage) {
			t.Fatalf("err = %v, want symlink refused", err)
		}
	})

	for _, tc := range []struct {
		name    string
		entries []tarEntry
	}{
		{"layer ../evil", []tarEntry{fileE("ok", "ok"), fileE("../evil", "evil")}},
		{"layer through symlink", []tarEntry{
			{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "esc", Linkname: "/tmp"}},
			fileE("esc/evil", "evil"),
		}},
		{"hard link outside", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "../../etc/passwd"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Refused at import, which reads every entry as unpacking will,
			// and nothing of it kept.
			s := openStore(t)
			layer := tarLayer(t, tc.entries...)
			if _, err := s.ImportImage(ctx, testImage(t, "amd64", layer)); !errors.Is(err, ErrInvalidImage) {
				t.Fatalf("import: err = %v, want ErrInvalidImage", err)
			} else {
				t.Log(err)
			}
			assertClean(t, s)
			// And by the unpacking itself, which trusts no import.
			rc, err := layer.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			root := filepath.Join(t.TempDir(), "layer", "root")
			if err := os.MkdirAll(root, 0o755); err != nil {
				t.Fatal(err)
			}
			if _, err := extractLayer(tar.NewReader(rc), root, 1<<30); !errors.Is(err, ErrInvalidImage) {
				t.Fatalf("unpack: err = %v, want ErrInvalidImage", err)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(root)), "evil")); err == nil {
				t.Error("evil written outside the layer")
			}
		})
	}
}

func TestProgressReachesTotal(t *testing.T) {
	ctx := context.Background()
	big := make([]byte, 3<<20+12345) // incompressible, so > 3 MiB compressed
	rand.Read(big)
	img0 := testImage(t, "amd64",
		tarLayer(t, tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644}, body: big}),
		tarLayer(t, fileE("small", "small")),
	)
	s := openStore(t)
	img, err := s.ImportImage(ctx, img0)
	if err != nil {
		t.Fatal(err)
	}
	var want uint64
	for _, l := range img.Layers {
		want += uint64(l.Size)
	}
	var calls [][2]uint64
	if _, err := s.Unpack(ctx, img, func(d, total uint64) { calls = append(calls, [2]uint64{d, total}) }); err != nil {
		t.Fatal(err)
	}
	if len(calls) < 3 {
		t.Fatalf("progress calls %v, want one per MiB", calls)
	}
	var prev uint64
	for _, c := range calls {
		if c[1] != want || c[0] < prev || c[0]-prev > 1<<20+64<<10 {
			t.Errorf("progress %v after %d (total %d): not monotonic, or a gap over 1 MiB", c, prev, want)
		}
		prev = c[0]
	}
	if last := calls[len(calls)-1]; last[0] != want {
		t.Errorf("last progress %v, want %d", last, want)
	}
	n, err := s.UnpackedBytes(img)
	if err != nil || n != uint64(len(big))+5 {
		t.Errorf("UnpackedBytes = %d, %v; want %d", n, err, len(big)+5)
	}
}

// A host fetches an image's blobs from ctrl with Blob/PutBlob, then unpacks.
func TestBlobTransfer(t *testing.T) {
	ctx := context.Background()
	ctrl, host := openStore(t), openStore(t)
	img, err := ctrl.ImportImage(ctx, twoLayerImage(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := host.PutBlob(img.ManifestDigest, strings.NewReader("not the manifest")); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("PutBlob of wrong content: %v", err)
	}
	if _, err := host.Image(img.ManifestDigest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Image before transfer: %v", err)
	}
	for _, d := range img.Blobs() {
		rc, size, err := ctrl.Blob(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := host.PutBlob(d, rc); err != nil {
			t.Fatal(err)
		}
		rc.Close()
		if !host.HasBlob(d) {
			t.Fatalf("HasBlob(%s) false after PutBlob", d)
		}
		if _, got, _ := host.Blob(d); got != size {
			t.Errorf("blob %s: size %d, want %d", d, got, size)
		}
	}
	got, err := host.Image(img.ManifestDigest)
	if err != nil || !slices.Equal(got.Layers, img.Layers) {
		t.Fatalf("host Image = %+v, %v", got, err)
	}
	if _, err := host.Unpack(ctx, got, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := host.Blob("sha256:" + strings.Repeat("0", 64)); !errors.Is(err, ErrNotFound) {
		t.Errorf("Blob of missing digest: %v", err)
	}
	if host.HasBlob("../../etc/passwd") {
		t.Error("HasBlob accepted a path")
	}
}

// An archive as `docker save` before Docker 25 writes it: uncompressed layer.tar files
// named by manifest.json. go-containerregistry compresses them on import.
func TestDockerSaveUncompressedArchive(t *testing.T) {
	ctx := context.Background()
	src := twoLayerImage(t)
	rawConfig, _ := src.RawConfigFile()
	layers, _ := src.Layers()

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, data []byte) {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))})
		tw.Write(data)
	}
	add("config.json", rawConfig)
	var names []string
	for i, l := range layers {
		rc, _ := l.Uncompressed()
		data, _ := io.ReadAll(rc)
		rc.Close()
		n := string(rune('a'+i)) + "/layer.tar"
		add(n, data)
		names = append(names, `"`+n+`"`)
	}
	add("manifest.json", []byte(`[{"Config":"config.json","RepoTags":["kibotos.test/old:1"],"Layers":[`+strings.Join(names, ",")+`]}]`))
	tw.Close()

	s := openStore(t)
	img, err := s.ImportArchive(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range layers {
		d, _ := l.DiffID()
		if img.Layers[i].DiffID != d.String() {
			t.Errorf("layer %d diffID %s, want %s", i, img.Layers[i].DiffID, d)
		}
	}
	dirs, err := s.Unpack(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dirs[1], "data/new")); err != nil || string(b) != "new" {
		t.Errorf("data/new = %q, %v", b, err)
	}
}

// zstd layers, and concurrent Unpack of the same image.
func TestZstdLayerConcurrentUnpack(t *testing.T) {
	ctx := context.Background()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "z", Mode: 0o644, Size: 4, ModTime: mtime})
	tw.Write([]byte("zstd"))
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	img, err := s.ImportImage(ctx, testImage(t, "amd64", l, tarLayer(t, fileE("g", "gzip"))))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		dirs []string
		err  error
	}
	results := make(chan result, 4)
	for range 4 {
		go func() {
			dirs, err := s.Unpack(ctx, img, nil)
			results <- result{dirs, err}
		}()
	}
	var first []string
	for range 4 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if first == nil {
			first = r.dirs
		} else if !slices.Equal(r.dirs, first) {
			t.Errorf("Unpack results differ: %v vs %v", r.dirs, first)
		}
	}
	if b, err := os.ReadFile(filepath.Join(first[0], "z")); err != nil || string(b) != "zstd" {
		t.Errorf("z = %q, %v", b, err)
	}
	if names := dirEntries(t, s.tmpDir()); len(names) != 0 {
		t.Errorf("tmp after unpack: %v", names)
	}
}

// TestWhiteoutsOfTheirOwnLayer: a whiteout hides the lower layers' entry
// only, in whatever order it comes in its layer (a sorted tar puts .wh.X
// before X/): an entry of its own layer stays, and a directory it hides
// below and makes anew shows only its new entries.
func TestWhiteoutsOfTheirOwnLayer(t *testing.T) {
	ctx := context.Background()
	lower := tarLayer(t, fileE("a", "lower a"), dirE("d/", 0o755), fileE("d/old", "old"), dirE("e/", 0o755), fileE("e/old", "old"))
	upper := tarLayer(t,
		fileE("a", "upper a"), fileE(".wh.a", ""), // after its own entry
		fileE(".wh.d", ""), dirE("d/", 0o755), fileE("d/new", "new"), // before, then a directory anew
		fileE(".wh.e", ""), fileE("e/new", "new"), // before, then an entry under it
	)
	s := openStore(t)
	img, err := s.ImportImage(ctx, testImage(t, "amd64", lower, upper))
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := s.Unpack(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}
	merged := t.TempDir()
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_RDONLY, "lowerdir="+dirs[1]+":"+dirs[0]); err != nil {
		t.Skipf("overlay mount unavailable: %v", err)
	}
	defer unix.Unmount(merged, unix.MNT_DETACH)
	if b, err := os.ReadFile(filepath.Join(merged, "a")); err != nil || string(b) != "upper a" {
		t.Errorf("a = %q, %v; want the upper layer's", b, err)
	}
	for _, d := range []string{"d", "e"} {
		if got := dirEntries(t, filepath.Join(merged, d)); !slices.Equal(got, []string{"new"}) {
			t.Errorf("%s/ = %v, want [new]", d, got)
		}
	}
}
