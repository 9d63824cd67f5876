package diskimage

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// TestCreateLikeGrownImageHoldsWhatFilledIt grows images from one size to
// another, fills each to the last block, and makes a new image of the
// grown size laid out like it: the new one has at least the room, and
// what filled the grown one fits in it. One made for its size alone has
// less room (the journal and inode table of the larger size).
func TestCreateLikeGrownImageHoldsWhatFilledIt(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	for _, c := range []struct {
		from, to uint64
		fill     bool
	}{
		{1 * MiB, 4 * MiB, true},   // no journal at 1 MiB, one at 4 MiB
		{3 * MiB, 40 * MiB, true},  // 1 KiB blocks, a small journal
		{64 * MiB, 2 << 30, false}, // 1 KiB blocks grown past the 4 KiB-block sizes
		{1 << 30, 64 << 30, false}, // a 32 MiB journal where mkfs gives 256 MiB
	} {
		t.Run(strconv.FormatUint(c.from/MiB, 10)+"MiB-to-"+strconv.FormatUint(c.to/MiB, 10)+"MiB", func(t *testing.T) {
			dir := t.TempDir()
			grown := filepath.Join(dir, "grown.img")
			if err := Create(ctx, grown, c.from, ""); err != nil {
				t.Fatal(err)
			}
			if err := Grow(ctx, grown, c.to); err != nil {
				t.Fatal(err)
			}
			g, err := ReadGeometry(grown)
			if err != nil {
				t.Fatal(err)
			}
			checkGeometryAsDumpe2fs(t, grown, g)

			fresh := filepath.Join(dir, "fresh.img")
			var content [32]byte
			fill := func(string) error { return nil }
			if c.fill {
				mnt, _, unmount := mountImage(t, grown, 0)
				content = fillUp(t, filepath.Join(mnt, "all"))
				fill = func(dir string) error {
					src, err := os.Open(filepath.Join(mnt, "all"))
					if err != nil {
						return err
					}
					defer src.Close()
					dst, err := os.Create(filepath.Join(dir, "all"))
					if err != nil {
						return err
					}
					defer dst.Close()
					if _, err := io.Copy(dst, src); err != nil {
						return err
					}
					return dst.Sync()
				}
				defer unmount()
			}
			if err := CreateFilled(ctx, fresh, c.to, "", &g, fill); err != nil {
				t.Fatalf("a new image laid out like the grown one does not hold what filled it: %v", err)
			}
			if err := fsck(fresh); err != nil {
				t.Fatal(err)
			}
			if c.fill {
				mnt, _, unmount := mountImage(t, fresh, syscall.MS_RDONLY)
				if hashFile(t, filepath.Join(mnt, "all")) != content {
					t.Fatal("the copy differs")
				}
				unmount()
			} else {
				grownInfo, freshInfo := inspect(t, grown), inspect(t, fresh)
				if freshInfo.UsedBytes > grownInfo.UsedBytes {
					t.Fatalf("the new image leaves %d bytes for files, the grown one %d",
						freshInfo.Capacity()-freshInfo.UsedBytes, grownInfo.Capacity()-grownInfo.UsedBytes)
				}
			}
			if fg, err := ReadGeometry(fresh); err != nil || fg != g {
				t.Fatalf("the new image's geometry is %+v (%v), the grown one's %+v", fg, err, g)
			}

			if c.from == 1*MiB {
				plain := filepath.Join(dir, "plain.img")
				if err := Create(ctx, plain, c.to, ""); err != nil {
					t.Fatal(err)
				}
				if inspect(t, plain).UsedBytes <= inspect(t, grown).UsedBytes {
					t.Fatal("an image made for its size alone has as much room as the grown one: the case shows nothing")
				}
			}
		})
	}
}

// checkGeometryAsDumpe2fs checks g against what dumpe2fs reads of img.
func checkGeometryAsDumpe2fs(t *testing.T, img string, g Geometry) {
	t.Helper()
	d := dumpe2fs(t, img)
	want := map[string]uint64{
		"Block size": uint64(g.BlockSize), "Inode size": uint64(g.InodeSize), "Inode count": uint64(g.Inodes),
		"Blocks per group": uint64(g.BlocksPerGroup), "Reserved GDT blocks": uint64(g.ReservedGDTBlocks),
	}
	if g.Journal {
		want["Total journal blocks"] = g.JournalBytes / uint64(g.BlockSize)
	}
	for field, v := range want {
		if got, err := strconv.ParseUint(d[field], 10, 64); err != nil || got != v {
			t.Errorf("%s: dumpe2fs says %q, ReadGeometry %d", field, d[field], v)
		}
	}
}

// fillUp writes random bytes to path until its filesystem is full, syncs
// them and returns their hash.
func fillUp(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		rand.Read(buf)
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	// What the last write left half-written is in the file too.
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	return hashFile(t, path)
}

func inspect(t *testing.T, img string) Info {
	t.Helper()
	i, err := Inspect(img)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// TestCreateLikeRefusesImpossibleGeometry: a geometry no ext4 filesystem
// has (an artifact may carry anything) is refused, and no image is made.
func TestCreateLikeRefusesImpossibleGeometry(t *testing.T) {
	good := Geometry{BlockSize: 4096, InodeSize: 256, Inodes: 1024, BlocksPerGroup: 32768, Journal: true, JournalBytes: 4 * MiB, ReservedGDTBlocks: 7, DescSize: 64}
	if _, _, err := good.mkfsArgs(64 * MiB); err != nil {
		t.Fatalf("a plain geometry is refused: %v", err)
	}
	for name, change := range map[string]func(*Geometry){
		"block size":       func(g *Geometry) { g.BlockSize = 3000 },
		"huge blocks":      func(g *Geometry) { g.BlockSize = 1 << 20 },
		"inode size":       func(g *Geometry) { g.InodeSize = 100 },
		"inode over block": func(g *Geometry) { g.BlockSize, g.InodeSize = 1024, 2048 },
		"no inodes":        func(g *Geometry) { g.Inodes = 0 },
		"group":            func(g *Geometry) { g.BlocksPerGroup = 100 },
		"group too large":  func(g *Geometry) { g.BlocksPerGroup = 8*4096 + 8 },
		"descriptor":       func(g *Geometry) { g.DescSize = 0 },
	} {
		g := good
		change(&g)
		img := filepath.Join(t.TempDir(), "v.img")
		if err := CreateFilled(context.Background(), img, 64*MiB, "", &g, nil); err == nil {
			t.Errorf("%s: geometry %+v accepted", name, g)
		}
		if _, err := os.Stat(img); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: an image was made: %v", name, err)
		}
	}
}
