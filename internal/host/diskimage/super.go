package diskimage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// ErrNotExt4 is returned (wrapped) by Inspect for a file that holds no
// valid ext4 superblock.
var ErrNotExt4 = errors.New("diskimage: not an ext4 image")

// Info describes an image.
type Info struct {
	// Size is the size of the image file.
	Size uint64
	// Filesystem is the size of the filesystem in it: smaller than Size
	// while a growth that extended the file has not grown the filesystem.
	Filesystem uint64
	// UUID is the filesystem's UUID, canonical (8-4-4-4-12, lower case).
	UUID string
	// Label is the filesystem's volume label; empty when it has none.
	Label string
	// UsedBytes is what the filesystem's blocks in use (data and the
	// filesystem's own metadata) take, as the superblock last recorded
	// it: exact for an image that is not mounted.
	UsedBytes uint64
	// DataBytes is UsedBytes but for the filesystem's own structures
	// (superblocks, group descriptors, bitmaps, inode tables, journal):
	// what its files take, as statfs of its mount says.
	DataBytes uint64
}

// Capacity is what the image really holds: the smaller of the file and its
// filesystem (a growth interrupted between the two leaves them apart; the
// next Grow finishes it).
func (i Info) Capacity() uint64 { return min(i.Size, i.Filesystem) }

// Offsets and flags of the ext4 superblock (see the kernel's
// fs/ext4/ext4.h, struct ext4_super_block).
const (
	superOffset          = 1024
	superSize            = 1024
	offInodesCount       = 0x00
	offBlocksCountLo     = 0x04
	offFreeBlocksLo      = 0x0C
	offFirstDataBlock    = 0x14
	offLogBlockSize      = 0x18
	offBlocksPerGroup    = 0x20
	offInodesPerGroup    = 0x28
	offMagic             = 0x38
	offInodeSize         = 0x58
	offFeatureCompat     = 0x5C
	offFeatureIncompat   = 0x60
	offFeatureROCompat   = 0x64
	offUUID              = 0x68
	offVolumeName        = 0x78
	offReservedGDTBlocks = 0xCE
	offJournalBackupType = 0xFD
	offDescSize          = 0xFE
	// offJournalBlocks is s_jnl_blocks: a copy of the journal inode's
	// block map, then its size (the high 32 bits, then the low).
	offJournalBlocks = 0x10C
	offBlocksCountHi = 0x150
	offFreeBlocksHi  = 0x158
	offOverhead      = 0x248 // s_overhead_clusters
	offBackupBGs     = 0x24C // s_backup_bgs[2], with sparse_super2
	offChecksum      = 0x3FC

	ext4Magic           = 0xEF53
	compatHasJournal    = 0x04
	compatResizeInode   = 0x10
	compatSparseSuper2  = 0x200
	incompatMetaBG      = 0x10
	incompat64Bit       = 0x80
	roCompatSparseSuper = 0x01
	roCompatBigalloc    = 0x200
	roCompatMetaCsum    = 0x400
	maxLogBlockSize     = 6  // 64 KiB blocks
	journalBackupBlocks = 1  // s_jnl_blocks holds the journal inode's map
	descSize32          = 32 // a group descriptor without the 64bit feature
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// superblock is what Inspect and ReadGeometry read of an ext4 superblock.
type superblock struct {
	uuid       [16]byte
	label      string
	blockSize  uint64
	blocks     uint64
	freeBlocks uint64
	// overhead is the blocks the filesystem's own structures take
	// (overheadBlocks); 0 when it cannot tell.
	overhead uint64
	geometry Geometry
}

// bytes is the size of the filesystem.
func (sb superblock) bytes() uint64 { return sb.blocks * sb.blockSize }

// Inspect reads the ext4 superblock of the image at path. It returns an
// error wrapping ErrNotExt4 when the file holds no valid one (wrong
// magic, impossible geometry, a checksum that does not match), and the
// os errors of opening and reading the file as they are.
func Inspect(path string) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	sb, err := readSuper(f)
	if err != nil {
		return Info{}, fmt.Errorf("diskimage: %s: %w", path, err)
	}
	return Info{
		Size:       uint64(fi.Size()),
		Filesystem: sb.bytes(),
		UUID:       formatUUID(sb.uuid),
		Label:      sb.label,
		UsedBytes:  (sb.blocks - sb.freeBlocks) * sb.blockSize,
		DataBytes:  (sb.blocks - sb.freeBlocks - min(sb.overhead, sb.blocks-sb.freeBlocks)) * sb.blockSize,
	}, nil
}

// overheadBlocks returns the blocks an ext4 filesystem's own structures
// take: what the superblock b records (s_overhead_clusters, which mke2fs
// writes and resize2fs clears), else the sum the kernel makes for statfs
// (ext4_calculate_overhead): the blocks before the first group, each
// group's bitmaps and inode table, each backup group's superblock, group
// descriptors and reserved descriptors, and the journal. 0 when it cannot
// tell (meta_bg, bigalloc).
func overheadBlocks(b []byte, sb superblock) uint64 {
	le := binary.LittleEndian
	if recorded := uint64(le.Uint32(b[offOverhead:])); recorded != 0 {
		return recorded
	}
	compat, incompat, roCompat := le.Uint32(b[offFeatureCompat:]), le.Uint32(b[offFeatureIncompat:]), le.Uint32(b[offFeatureROCompat:])
	g := sb.geometry
	first, perGroup := uint64(le.Uint32(b[offFirstDataBlock:])), uint64(g.BlocksPerGroup)
	if incompat&incompatMetaBG != 0 || roCompat&roCompatBigalloc != 0 || perGroup == 0 || sb.blocks <= first {
		return 0
	}
	groups := ceilDiv(sb.blocks-first, perGroup)
	inodeTable := ceilDiv(uint64(le.Uint32(b[offInodesPerGroup:]))*uint64(g.InodeSize), sb.blockSize)
	descriptors := ceilDiv(groups*uint64(g.DescSize), sb.blockSize)
	hasBackup := func(group uint64) bool {
		switch {
		case group == 0:
			return true
		case compat&compatSparseSuper2 != 0:
			return group == uint64(le.Uint32(b[offBackupBGs:])) || group == uint64(le.Uint32(b[offBackupBGs+4:]))
		case roCompat&roCompatSparseSuper == 0 || group == 1:
			return true
		}
		for _, base := range []uint64{3, 5, 7} {
			p := base
			for p < group {
				p *= base
			}
			if p == group {
				return true
			}
		}
		return false
	}
	total := first + groups*(2+inodeTable) + g.JournalBytes/sb.blockSize
	for group := range groups {
		if hasBackup(group) {
			total += 1 + descriptors + uint64(g.ReservedGDTBlocks)
		}
	}
	return total
}

// readSuper reads and checks the primary superblock of r.
func readSuper(r io.ReaderAt) (superblock, error) {
	b := make([]byte, superSize)
	if _, err := r.ReadAt(b, superOffset); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return superblock{}, fmt.Errorf("%w: too short for a superblock", ErrNotExt4)
		}
		return superblock{}, err
	}
	le := binary.LittleEndian
	if m := le.Uint16(b[offMagic:]); m != ext4Magic {
		return superblock{}, fmt.Errorf("%w: magic %#04x", ErrNotExt4, m)
	}
	if le.Uint32(b[offFeatureROCompat:])&roCompatMetaCsum != 0 {
		// e2fsprogs and the kernel store crc32c(~0, ...) without the final
		// inversion that hash/crc32 applies.
		if want, got := le.Uint32(b[offChecksum:]), ^crc32.Checksum(b[:offChecksum], castagnoli); want != got {
			return superblock{}, fmt.Errorf("%w: superblock checksum %#08x, computed %#08x", ErrNotExt4, want, got)
		}
	}
	logBlock := le.Uint32(b[offLogBlockSize:])
	if logBlock > maxLogBlockSize {
		return superblock{}, fmt.Errorf("%w: block size 2^%d KiB", ErrNotExt4, logBlock)
	}
	sb := superblock{
		blockSize:  1024 << logBlock,
		blocks:     uint64(le.Uint32(b[offBlocksCountLo:])),
		freeBlocks: uint64(le.Uint32(b[offFreeBlocksLo:])),
	}
	if le.Uint32(b[offFeatureIncompat:])&incompat64Bit != 0 {
		sb.blocks |= uint64(le.Uint32(b[offBlocksCountHi:])) << 32
		sb.freeBlocks |= uint64(le.Uint32(b[offFreeBlocksHi:])) << 32
	}
	if sb.blocks == 0 || sb.freeBlocks > sb.blocks {
		return superblock{}, fmt.Errorf("%w: %d blocks, %d free", ErrNotExt4, sb.blocks, sb.freeBlocks)
	}
	compat := le.Uint32(b[offFeatureCompat:])
	sb.geometry = Geometry{
		BlockSize:      uint32(sb.blockSize),
		InodeSize:      le.Uint16(b[offInodeSize:]),
		Inodes:         le.Uint32(b[offInodesCount:]),
		BlocksPerGroup: le.Uint32(b[offBlocksPerGroup:]),
	}
	if compat&compatResizeInode != 0 {
		sb.geometry.ReservedGDTBlocks = le.Uint16(b[offReservedGDTBlocks:])
	}
	if compat&compatHasJournal != 0 {
		sb.geometry.Journal = true
		if b[offJournalBackupType] == journalBackupBlocks {
			sb.geometry.JournalBytes = uint64(le.Uint32(b[offJournalBlocks+15*4:]))<<32 | uint64(le.Uint32(b[offJournalBlocks+16*4:]))
		}
	}
	sb.geometry.DescSize = descSize32
	if le.Uint32(b[offFeatureIncompat:])&incompat64Bit != 0 {
		sb.geometry.DescSize = uint32(le.Uint16(b[offDescSize:]))
	}
	sb.overhead = overheadBlocks(b, sb)
	copy(sb.uuid[:], b[offUUID:])
	label := b[offVolumeName : offVolumeName+16]
	for i, c := range label {
		if c == 0 {
			label = label[:i]
			break
		}
	}
	sb.label = string(label)
	return sb, nil
}

// formatUUID renders a UUID as 8-4-4-4-12 lower-case hex digits.
func formatUUID(u [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
