package diskimage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// growChildEnv selects the child mode of the test binary: it grows the
// image "PATH:BYTES" and exits, 0 on success.
const growChildEnv = "DISKIMAGE_TEST_GROW_CHILD"

func TestMain(m *testing.M) {
	if arg := os.Getenv(growChildEnv); arg != "" {
		os.Exit(growChild(arg))
	}
	os.Exit(m.Run())
}

func growChild(arg string) int {
	i := strings.LastIndexByte(arg, ':')
	n, err := strconv.ParseUint(arg[i+1:], 10, 64)
	if i < 0 || err != nil {
		fmt.Fprintf(os.Stderr, "bad %s=%q\n", growChildEnv, arg)
		return 2
	}
	if err := Grow(context.Background(), arg[:i], n); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startGrowChild starts the test binary as a child that grows img to n.
// It runs in its own process group, so that whatever it started can be
// killed with it.
func startGrowChild(t testing.TB, img string, n uint64) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", growChildEnv, img, n))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// killGroup kills the child and its process group with SIGKILL and
// reaps the child.
func killGroup(cmd *exec.Cmd) {
	pid := cmd.Process.Pid
	unix.Kill(pid, unix.SIGKILL)
	cmd.Wait()
	// The tools it ran die with it (their parent-death signal); anything
	// of the group that did not is ended here.
	unix.Kill(-pid, unix.SIGKILL)
}

// resetImage replaces img with a copy of orig.
func resetImage(t testing.TB, orig, img string) {
	t.Helper()
	if err := os.Remove(img); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	src, err := os.Open(orig)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	fi, _ := src.Stat()
	dst, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if err := copyImage(context.Background(), dst, src, fi.Size()); err != nil {
		t.Fatal(err)
	}
}

// TestGrowKilled kills a process growing an image with SIGKILL at points
// spread over the whole Grow (before it starts, during the copy, e2fsck,
// resize2fs and sync, and after it ends). Every time the image must be
// the old one or the grown one, clean, mountable, with its data intact;
// a Grow after the kills completes and leaves no temporary image.
func TestGrowKilled(t *testing.T) {
	needHost(t)
	const oldSize, newSize = 256 << 20, 512 << 20
	dir := t.TempDir()
	orig, img := filepath.Join(dir, "orig.img"), filepath.Join(dir, "v.img")
	if err := Create(context.Background(), orig, oldSize, ""); err != nil {
		t.Fatal(err)
	}
	sum := writeData(t, orig, "data", 24<<20)

	// How long a whole Grow in a child takes, seen from here.
	resetImage(t, orig, img)
	t0 := time.Now()
	cmd := startGrowChild(t, img, newSize)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child Grow: %v", err)
	}
	full := time.Since(t0)
	if fi, _ := os.Stat(img); fi.Size() != newSize {
		t.Fatalf("child Grow left %d bytes", fi.Size())
	}
	t.Logf("a child's Grow takes %v", full)

	// Kill points every full/16 from 0 on, until several kills came after
	// the end (a Grow's time varies with the disk's).
	const minPoints, minAfter, maxPoints = 24, 4, 200
	step := full / 16
	var olds, news, withTemp, points int
	for ; points < minPoints || news < minAfter; points++ {
		if points == maxPoints {
			t.Fatalf("%d kills, %d after the end of the Grow", points, news)
		}
		delay := step * time.Duration(points)
		resetImage(t, orig, img)
		cmd := startGrowChild(t, img, newSize)
		time.Sleep(delay)
		killGroup(cmd)

		fi, err := os.Stat(img)
		if err != nil {
			t.Fatalf("kill after %v: %v", delay, err)
		}
		switch fi.Size() {
		case oldSize:
			olds++
		case newSize:
			news++
		default:
			t.Fatalf("kill after %v: image of %d bytes", delay, fi.Size())
		}
		temp := len(temps(t, img)) > 0
		if temp {
			withTemp++
		}
		if err := fsck(img); err != nil {
			t.Fatalf("kill after %v (%d bytes): %v", delay, fi.Size(), err)
		}
		mnt, _, unmount := mountImage(t, img, unix.MS_RDONLY)
		if hashFile(t, filepath.Join(mnt, "data")) != sum {
			t.Errorf("kill after %v (%d bytes): data changed", delay, fi.Size())
		}
		unmount()
		t.Logf("kill after %6.1f ms: %3d MiB, temporary image left: %v", float64(delay.Microseconds())/1000, fi.Size()>>20, temp)
	}
	t.Logf("%d kills: %d left the old image, %d the grown one, %d a temporary image", points, olds, news, withTemp)
	if olds == 0 || withTemp == 0 {
		t.Errorf("the kills did not spread over the Grow: %d old, %d grown, %d with a temporary image", olds, news, withTemp)
	}

	resetImage(t, orig, img)
	if err := Grow(context.Background(), img, newSize); err != nil {
		t.Fatal(err)
	}
	if l := temps(t, img); len(l) > 0 {
		t.Errorf("temporary images left after a complete Grow: %v", l)
	}
	if info, err := Inspect(img); err != nil || info.Size != newSize {
		t.Errorf("Inspect = %+v, %v", info, err)
	}
	if err := fsck(img); err != nil {
		t.Error(err)
	}
}

// BenchmarkGrow1GiB grows a 1 GiB image holding 50 MiB of data to 2 GiB
// (the copy of the image is made anew, untimed, for each round).
func BenchmarkGrow1GiB(b *testing.B) {
	needHost(b)
	dir := b.TempDir()
	orig, img := filepath.Join(dir, "orig.img"), filepath.Join(dir, "v.img")
	if err := Create(context.Background(), orig, 1<<30, ""); err != nil {
		b.Fatal(err)
	}
	writeData(b, orig, "data", 50<<20)
	for b.Loop() {
		b.StopTimer()
		resetImage(b, orig, img)
		b.StartTimer()
		if err := Grow(context.Background(), img, 2<<30); err != nil {
			b.Fatal(err)
		}
	}
}
