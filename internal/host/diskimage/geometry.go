package diskimage

import (
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"
)

// Geometry is the layout of an ext4 filesystem that decides how much of
// its size is left for files: block size, inode table, journal and the
// blocks reserved for growing its group descriptors. mkfs picks them from
// the size it is given, and Grow keeps those of the first size: a
// filesystem grown from 1 GiB to 200 GiB keeps a journal of 1 GiB's, so
// one made afresh at 200 GiB holds about 1 GiB less. Create with a
// filesystem's Geometry lays the new one out alike (CreateFilled), so
// that whatever filled the old one fits in the new one of the same size.
type Geometry struct {
	BlockSize      uint32 `json:"block_size"`
	InodeSize      uint16 `json:"inode_size"`
	Inodes         uint32 `json:"inodes"`
	BlocksPerGroup uint32 `json:"blocks_per_group"`
	// Journal says whether it has one; JournalBytes is its size, 0 when
	// the superblock does not record it (mkfs then picks one).
	Journal      bool   `json:"journal"`
	JournalBytes uint64 `json:"journal_bytes,omitempty"`
	// ReservedGDTBlocks are the blocks kept for the group descriptors of
	// an online growth (the resize_inode feature; 0 without it).
	ReservedGDTBlocks uint16 `json:"reserved_gdt_blocks"`
	// DescSize is the size of one group descriptor.
	DescSize uint32 `json:"desc_size"`
}

// ReadGeometry reads the Geometry of the image at path from its
// superblock.
func ReadGeometry(path string) (Geometry, error) {
	f, err := os.Open(path)
	if err != nil {
		return Geometry{}, err
	}
	defer f.Close()
	sb, err := readSuper(f)
	if err != nil {
		return Geometry{}, fmt.Errorf("diskimage: %s: %w", path, err)
	}
	return sb.geometry, nil
}

// mkfsArgs are the options of mkfs.ext4 that lay a filesystem of size
// bytes out like g, and what it adds to the extended options (-E, which
// mkfs takes once). A Geometry that no ext4 filesystem can have (it may
// come from an artifact of anywhere) is an error.
func (g Geometry) mkfsArgs(size uint64) (args []string, extended string, err error) {
	isPow2 := func(v uint64) bool { return v != 0 && bits.OnesCount64(v) == 1 }
	switch {
	case !isPow2(uint64(g.BlockSize)) || g.BlockSize < 1024 || g.BlockSize > 1024<<maxLogBlockSize:
		return nil, "", fmt.Errorf("diskimage: block size %d is not one of ext4's", g.BlockSize)
	case !isPow2(uint64(g.InodeSize)) || g.InodeSize < 128 || uint32(g.InodeSize) > g.BlockSize:
		return nil, "", fmt.Errorf("diskimage: inode size %d is not one of ext4's for %d-byte blocks", g.InodeSize, g.BlockSize)
	case g.Inodes == 0:
		return nil, "", fmt.Errorf("diskimage: a filesystem of no inodes")
	case g.BlocksPerGroup < 256 || g.BlocksPerGroup%8 != 0 || g.BlocksPerGroup > 8*g.BlockSize:
		return nil, "", fmt.Errorf("diskimage: %d blocks per group is not one of ext4's for %d-byte blocks", g.BlocksPerGroup, g.BlockSize)
	case !isPow2(uint64(g.DescSize)) || g.DescSize < descSize32 || g.DescSize > g.BlockSize:
		return nil, "", fmt.Errorf("diskimage: group descriptors of %d bytes are not ext4's", g.DescSize)
	}
	args = []string{"-b", strconv.Itoa(int(g.BlockSize)), "-I", strconv.Itoa(int(g.InodeSize)),
		"-N", strconv.Itoa(int(g.Inodes)), "-g", strconv.Itoa(int(g.BlocksPerGroup))}
	var off []string
	switch {
	case !g.Journal:
		off = append(off, "^has_journal")
	case g.JournalBytes > 0:
		// mkfs takes the size in MiB: a journal's is a whole number of
		// them, at least one.
		args = append(args, "-J", "size="+strconv.FormatUint(max(g.JournalBytes>>20, 1), 10))
	}
	if g.ReservedGDTBlocks == 0 {
		off = append(off, "^resize_inode")
	} else {
		// mkfs reserves the descriptor blocks of a filesystem of up to
		// "resize" blocks, less those it uses: name the size whose
		// reservation is this one.
		blocks := size / uint64(g.BlockSize)
		var first uint64
		if g.BlockSize == 1024 {
			first = 1 // the superblock takes block 1, not 0
		}
		perBlock := uint64(g.BlockSize / g.DescSize)
		groups := ceilDiv(blocks-first, uint64(g.BlocksPerGroup))
		descBlocks := ceilDiv(groups, perBlock)
		extended = "resize=" + strconv.FormatUint((uint64(g.ReservedGDTBlocks)+descBlocks)*perBlock*uint64(g.BlocksPerGroup), 10)
	}
	if len(off) > 0 {
		args = append(args, "-O", strings.Join(off, ","))
	}
	return args, extended, nil
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }
