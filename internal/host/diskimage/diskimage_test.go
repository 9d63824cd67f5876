package diskimage

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// needHost skips unless the test can make filesystems and loop devices.
func needHost(t testing.TB) {
	t.Helper()
	hosttest.RequireRoot(t)
	for _, tool := range []string{"mkfs.ext4", "e2fsck", "resize2fs"} {
		if _, err := LookPath(tool); err != nil {
			t.Skip("needs " + tool)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs /dev/loop-control")
	}
}

// mountImage attaches img to a loop device and mounts it at a new
// directory; the returned function (also run at cleanup) unmounts it and
// waits until the device is free.
func mountImage(t testing.TB, img string, flags uintptr) (mnt, dev string, unmount func()) {
	t.Helper()
	mnt = t.TempDir()
	dev, f, err := AttachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Mount(dev, mnt, "ext4", flags|unix.MS_NODEV|unix.MS_NOSUID, "")
	f.Close()
	if err != nil {
		WaitLoopsReleased(img, 5*time.Second)
		t.Fatalf("mount %s (%s): %v", img, dev, err)
	}
	done := false
	unmount = func() {
		t.Helper()
		if done {
			return
		}
		done = true
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		if !WaitLoopsReleased(img, 10*time.Second) {
			t.Errorf("%s still attached to a loop device", img)
		}
	}
	t.Cleanup(unmount)
	return mnt, dev, unmount
}

// writeData writes n random bytes to name in the image's filesystem,
// syncs and unmounts it, and returns their hash.
func writeData(t testing.TB, img, name string, n int64) [32]byte {
	t.Helper()
	mnt, _, unmount := mountImage(t, img, 0)
	defer unmount()
	f, err := os.Create(filepath.Join(mnt, name))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, n); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return [32]byte(h.Sum(nil))
}

func hashFile(t testing.TB, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// fsck runs e2fsck -fn: nil when the filesystem is clean.
func fsck(img string) error {
	out, err := exec.Command("e2fsck", "-f", "-n", img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("e2fsck -fn: %v\n%s", err, out)
	}
	return nil
}

func temps(t testing.TB, img string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(filepath.Dir(img), tempPattern(img)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// dumpe2fs returns the fields of dumpe2fs -h.
func dumpe2fs(t testing.TB, img string) map[string]string {
	t.Helper()
	out, err := exec.Command("dumpe2fs", "-h", img).Output()
	if err != nil {
		t.Fatalf("dumpe2fs: %v", err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

var canonicalUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestCreateInspect(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	dir := t.TempDir()
	img := filepath.Join(dir, "sub", "v.img")
	for _, n := range []uint64{0, 64<<20 + 1, 512} {
		if err := Create(ctx, img, n, ""); err == nil {
			t.Errorf("Create accepted %d bytes", n)
		}
	}
	const uuid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	if err := Create(ctx, img, 64<<20, uuid); err != nil {
		t.Fatal(err)
	}
	info, err := Inspect(img)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != 64<<20 || info.UUID != uuid || info.Label != "" {
		t.Errorf("Inspect = %+v", info)
	}
	d := dumpe2fs(t, img)
	blocks, _ := strconv.ParseUint(d["Block count"], 10, 64)
	free, _ := strconv.ParseUint(d["Free blocks"], 10, 64)
	bs, _ := strconv.ParseUint(d["Block size"], 10, 64)
	if want := (blocks - free) * bs; info.UsedBytes != want || want == 0 {
		t.Errorf("UsedBytes = %d, dumpe2fs says %d", info.UsedBytes, want)
	}
	if !strings.Contains(d["Filesystem features"], "has_journal") || d["Reserved block count"] != "0" {
		t.Errorf("features %q, reserved blocks %q", d["Filesystem features"], d["Reserved block count"])
	}
	// The journal is there but not zeroed: the new image holds little
	// more than its metadata (with the 4 MiB journal zeroed, 4.4 MiB).
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil || st.Blocks*512 > 1<<20 {
		t.Errorf("a new 64 MiB image holds %d bytes on disk (%v), want at most 1 MiB", st.Blocks*512, err)
	}
	if out, err := exec.Command("e2label", img, "my-volume").CombinedOutput(); err != nil {
		t.Fatalf("e2label: %v %s", err, out)
	}
	if info, err := Inspect(img); err != nil || info.Label != "my-volume" || info.UUID != uuid {
		t.Errorf("Inspect after e2label = %+v, %v", info, err)
	}

	// An existing file is left as it is.
	before := hashFile(t, img)
	if err := Create(ctx, img, 128<<20, ""); err != nil {
		t.Fatal(err)
	}
	if hashFile(t, img) != before {
		t.Error("Create changed an existing image")
	}

	// Without a UUID, mkfs picks one; a large image has 4 KiB blocks.
	big := filepath.Join(dir, "big.img")
	if err := Create(ctx, big, 1<<30, ""); err != nil {
		t.Fatal(err)
	}
	info, err = Inspect(big)
	if err != nil || info.Size != 1<<30 || !canonicalUUID.MatchString(info.UUID) || info.UUID == uuid {
		t.Errorf("Inspect(big) = %+v, %v", info, err)
	}
	if d := dumpe2fs(t, big); d["Filesystem UUID"] != info.UUID {
		t.Errorf("UUID %s, dumpe2fs says %s", info.UUID, d["Filesystem UUID"])
	}
	if fi, err := os.Stat(big); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("image mode: %v %v", fi.Mode(), err)
	}
	if len(temps(t, img))+len(temps(t, big)) > 0 {
		t.Error("temporary images left")
	}
}

func TestInspectNotExt4(t *testing.T) {
	needHost(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "v.img")
	if err := Create(context.Background(), img, 16<<20, ""); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	corrupt := func(name string, f func(b []byte) []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, f(bytes.Clone(good)), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := map[string]string{
		"zeroed superblock": corrupt("zero", func(b []byte) []byte { clear(b[1024:2048]); return b }),
		"bad magic":         corrupt("magic", func(b []byte) []byte { b[1024+offMagic] ^= 0xff; return b }),
		"bad checksum":      corrupt("csum", func(b []byte) []byte { b[1024+offVolumeName] = 'x'; return b }),
		"too short":         corrupt("short", func(b []byte) []byte { return b[:1500] }),
		"not an image":      corrupt("text", func([]byte) []byte { return []byte("hello") }),
	}
	for name, p := range cases {
		if _, err := Inspect(p); !errors.Is(err, ErrNotExt4) {
			t.Errorf("%s: Inspect = %v, want ErrNotExt4", name, err)
		}
	}
	if _, err := Inspect(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Inspect(img); err != nil {
		t.Errorf("intact image: %v", err)
	}
}

func TestGrow(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	dir := t.TempDir()
	img := filepath.Join(dir, "v.img")
	if err := Create(ctx, img, 32<<20, ""); err != nil {
		t.Fatal(err)
	}
	os.Chmod(img, 0o640)
	sum := writeData(t, img, "data", 8<<20)
	info0, _ := Inspect(img)
	mnt, dev, unmount := mountImage(t, img, 0)
	_, total0, err := Usage(mnt)
	if err != nil {
		t.Fatal(err)
	}

	// In use: refused, naming the device.
	if err := Grow(ctx, img, 96<<20); err == nil || !strings.Contains(err.Error(), dev) {
		t.Errorf("Grow of a mounted image: %v, want an error naming %s", err, dev)
	}
	if err := Delete(img); err == nil || !strings.Contains(err.Error(), dev) {
		t.Errorf("Delete of a mounted image: %v, want an error naming %s", err, dev)
	}
	unmount()
	if err := Grow(ctx, img, 96<<20+4096); err == nil {
		t.Error("Grow accepted a size that is not whole MiB")
	}

	// A temporary image that a crash left is removed.
	stale := filepath.Join(dir, ".v.img.tmp-123")
	writeFileT(t, stale, "stale")
	if err := Grow(ctx, img, 96<<20); err != nil {
		t.Fatal(err)
	}
	if l := temps(t, img); len(l) > 0 {
		t.Errorf("temporary images left: %v", l)
	}
	info, err := Inspect(img)
	if err != nil || info.Size != 96<<20 || info.UUID != info0.UUID {
		t.Fatalf("Inspect after Grow = %+v, %v (before %+v)", info, err, info0)
	}
	if fi, _ := os.Stat(img); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode after Grow: %v", fi.Mode())
	}
	if err := fsck(img); err != nil {
		t.Error(err)
	}
	mnt, _, unmount = mountImage(t, img, 0)
	_, total, err := Usage(mnt)
	if err != nil || total < total0+50<<20 {
		t.Errorf("statfs total %d after Grow, %d before (%v)", total, total0, err)
	}
	if hashFile(t, filepath.Join(mnt, "data")) != sum {
		t.Error("data changed by Grow")
	}
	used, _, _ := Usage(mnt)
	if used < 8<<20 {
		t.Errorf("Usage used = %d, want at least the 8 MiB written", used)
	}
	unmount()

	// Already that large: nothing to do.
	before := hashFile(t, img)
	if err := Grow(ctx, img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := Grow(ctx, img, 96<<20); err != nil {
		t.Fatal(err)
	}
	if hashFile(t, img) != before {
		t.Error("Grow changed an image that was large enough")
	}
	if err := Grow(ctx, filepath.Join(dir, "missing.img"), 64<<20); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Grow of a missing image: %v", err)
	}

	writeFileT(t, stale, "stale")
	if err := Delete(img); err != nil {
		t.Fatal(err)
	}
	if err := Delete(img); err != nil {
		t.Errorf("Delete of a missing image: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Errorf("left after Delete: %v", ents)
	}
}

func writeFileT(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestGrowOnline: ProbeOnlineGrow tells whether the host allows it, and
// GrowOnline behaves accordingly; either way the image stays usable and
// an offline Grow finishes the job.
func TestGrowOnline(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	dir := t.TempDir()
	probeErr := ProbeOnlineGrow(ctx, dir)
	t.Logf("ProbeOnlineGrow: %v", probeErr)
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Errorf("the probe left %v", ents)
	}

	img := filepath.Join(dir, "v.img")
	if err := Create(ctx, img, 32<<20, ""); err != nil {
		t.Fatal(err)
	}
	sum := writeData(t, img, "data", 4<<20)
	if err := GrowOnline(ctx, img, "/dev/loop0", 64<<20); err == nil {
		t.Error("GrowOnline of an image that is not attached succeeded")
	}
	mnt, dev, unmount := mountImage(t, img, 0)
	_, total0, _ := Usage(mnt)
	err := GrowOnline(ctx, img, dev, 64<<20)
	_, total, _ := Usage(mnt)
	if probeErr == nil {
		if err != nil || total <= total0 {
			t.Errorf("GrowOnline = %v; statfs total %d, before %d", err, total, total0)
		}
	} else {
		if err == nil {
			t.Error("GrowOnline succeeded where the probe said it would not")
		}
		if fi, _ := os.Stat(img); fi.Size() != 32<<20 || total != total0 {
			t.Errorf("a refused GrowOnline left the file at %d bytes, statfs total %d (before %d)", fi.Size(), total, total0)
		}
	}
	if hashFile(t, filepath.Join(mnt, "data")) != sum {
		t.Error("data changed")
	}
	unmount()
	if err := fsck(img); err != nil {
		t.Error(err)
	}
	if err := Grow(ctx, img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if info, err := Inspect(img); err != nil || info.Size != 64<<20 {
		t.Errorf("Inspect = %+v, %v", info, err)
	}
	mnt, _, unmount = mountImage(t, img, 0)
	if _, total, _ := Usage(mnt); total < 50<<20 {
		t.Errorf("statfs total %d after growing to 64 MiB", total)
	}
	unmount()
}

// TestGrowFinishesExtendedFile: a file longer than its filesystem (an
// interrupted GrowOnline) is not "large enough": Grow grows the
// filesystem to it.
func TestGrowFinishesExtendedFile(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	img := filepath.Join(t.TempDir(), "v.img")
	if err := Create(ctx, img, 32<<20, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := Grow(ctx, img, 48<<20); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sb, err := readSuper(f)
	if err != nil || sb.bytes() != 64<<20 {
		t.Errorf("filesystem of %d bytes (%v), want 64 MiB", sb.bytes(), err)
	}
}

// TestProbeRemovesLeftovers: a probe the process was killed in (its
// scratch image still mounted) is cleaned up by the next probe.
func TestProbeRemovesLeftovers(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	dir := t.TempDir()
	scratch := filepath.Join(dir, ".online-grow-probe-left")
	img, mnt := filepath.Join(scratch, "probe.img"), filepath.Join(scratch, "mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Create(ctx, img, 16<<20, ""); err != nil {
		t.Fatal(err)
	}
	dev, f, err := AttachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Mount(dev, mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID, "")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if isMount(mnt) {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	ProbeOnlineGrow(ctx, dir)
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Errorf("left after the next probe: %v", ents)
	}
	if devs := LoopsOf(img); len(devs) > 0 {
		t.Errorf("the leftover image is still attached to %v", devs)
	}
}

// TestAttachLoopDirectIO checks that a loop device does direct I/O on an
// image whose filesystem allows it and reads ahead loopReadAhead, and that
// the filesystem on it keeps what is written through it.
func TestAttachLoopDirectIO(t *testing.T) {
	needHost(t)
	dir := t.TempDir()
	probe, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("the test directory's filesystem refuses O_DIRECT: %v", err)
	}
	probe.Close()
	img := filepath.Join(dir, "v.img")
	if err := Create(context.Background(), img, 64<<20, ""); err != nil {
		t.Fatal(err)
	}
	sum := writeData(t, img, "f", 8<<20)
	mnt, dev, unmount := mountImage(t, img, unix.MS_RDONLY)
	defer unmount()
	dio, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "dio"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(dio)); got != "1" {
		t.Errorf("%s of %s: dio = %s, want 1", dev, img, got)
	}
	ra, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", "read_ahead_kb"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(ra)), strconv.Itoa(loopReadAhead>>10); got != want {
		t.Errorf("%s of %s: read_ahead_kb = %s, want %s", dev, img, got, want)
	}
	b, err := os.ReadFile(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(b) != sum {
		t.Error("the file read back differs from the one written")
	}
}

// TestLoopsOf: an attached image is found by its path and, once renamed,
// by its inode; another image is not; once the device's last user closes
// it, autoclear detaches it and none is found.
func TestLoopsOf(t *testing.T) {
	needHost(t)
	dir := t.TempDir()
	img, other := filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img")
	for _, p := range []string{img, other} {
		if err := Create(context.Background(), p, 64<<20, ""); err != nil {
			t.Fatal(err)
		}
	}
	dev, f, err := AttachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	renamed := filepath.Join(dir, "renamed.img")
	t.Cleanup(func() {
		f.Close()
		WaitLoopsReleased(renamed, 10*time.Second)
		WaitLoopsReleased(img, 10*time.Second)
	})
	if got := LoopsOf(img); !slices.Equal(got, []string{dev}) {
		t.Errorf("LoopsOf(%s) = %v, want [%s]", img, got, dev)
	}
	if err := os.Rename(img, renamed); err != nil {
		t.Fatal(err)
	}
	if got := LoopsOf(renamed); !slices.Equal(got, []string{dev}) {
		t.Errorf("after a rename, LoopsOf(%s) = %v, want [%s]", renamed, got, dev)
	}
	// Through a symbolic link the path is spelled otherwise than the
	// kernel's, and the device is found by inode.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if got := LoopsOf(filepath.Join(link, "renamed.img")); !slices.Equal(got, []string{dev}) {
		t.Errorf("through a symbolic link, LoopsOf = %v, want [%s]", got, dev)
	}
	if got := LoopsOf(other); len(got) > 0 {
		t.Errorf("LoopsOf of an image never attached = %v", got)
	}
	f.Close()
	if !WaitLoopsReleased(renamed, 10*time.Second) {
		t.Errorf("%s is still attached after its last user closed it", dev)
	}
	if got := LoopsOf(renamed); len(got) > 0 {
		t.Errorf("after the detach, LoopsOf = %v", got)
	}
}

func TestIsLoopName(t *testing.T) {
	for name, want := range map[string]bool{"loop0": true, "loop127": true, "loop": false, "loop1p1": false, "loopx": false, "sda": false, "nvme0n1": false} {
		if got := isLoopName(name); got != want {
			t.Errorf("isLoopName(%q) = %v, want %v", name, got, want)
		}
	}
}

// BenchmarkLoopsOf times a scan for an image that is not attached, beside
// 16 attached ones and whatever loop devices the host already has (a host
// keeps every device it ever used, bound or not).
// TestWaitLoopsReleased: the wait follows the devices it found bound, and
// a device bound to the image meanwhile is waited for too.
func TestWaitLoopsReleased(t *testing.T) {
	needHost(t)
	img := filepath.Join(t.TempDir(), "a.img")
	if err := Create(context.Background(), img, 64<<20, ""); err != nil {
		t.Fatal(err)
	}
	_, first, err := AttachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	released := make(chan bool, 1)
	go func() { released <- WaitLoopsReleased(img, 10*time.Second) }()
	_, second, err := AttachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		second.Close()
		WaitLoopsReleased(img, 10*time.Second)
	}()
	first.Close()
	select {
	case ok := <-released:
		t.Fatalf("the wait ended (%v) while a second device was bound to the image", ok)
	case <-time.After(300 * time.Millisecond):
	}
	second.Close()
	if ok := <-released; !ok {
		t.Error("the wait gave up with both devices closed")
	}
	if devs := LoopsOf(img); len(devs) > 0 {
		t.Errorf("bound after the wait: %v", devs)
	}
}

func BenchmarkLoopsOf(b *testing.B) {
	needHost(b)
	dir := b.TempDir()
	for i := range 16 {
		img := filepath.Join(dir, fmt.Sprintf("%d.img", i))
		if err := Create(context.Background(), img, 64<<20, ""); err != nil {
			b.Fatal(err)
		}
		_, f, err := AttachLoop(img)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			f.Close()
			WaitLoopsReleased(img, 10*time.Second)
		})
	}
	// An image that exists is what a start asks about before attaching it.
	unattached := filepath.Join(dir, "unattached.img")
	if err := os.WriteFile(unattached, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		LoopsOf(unattached)
	}
	devs, _ := filepath.Glob("/sys/block/loop*")
	b.ReportMetric(float64(len(devs)), "devices")
	partitions, _ := os.ReadFile("/proc/partitions")
	b.ReportMetric(float64(strings.Count(string(partitions), " loop")), "bound")
}
