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
	offLogBlockSize      = 0x18
	offBlocksPerGroup    = 0x20
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
	offChecksum      = 0x3FC

	ext4Magic           = 0xEF53
	compatHasJournal    = 0x04
	compatResizeInode   = 0x10
	incompat64Bit       = 0x80
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
	geometry   Geometry
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
	}, nil
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
