// Package artifact is the format of a transfer artifact: one file that
// carries a stopped Workspace's writable layer, its Volume and a manifest
// (and, on request, its Template revision's image) between deployments.
// The host agent writes and extracts it, ctrl verifies it and reads its
// manifest; both use this package and nothing else knows the format.
//
// # Format (kibotos.transfer.v1)
//
// An artifact is a zstd stream (RFC 8878, with frame checksums) of one tar
// archive in the POSIX.1-2001 (PAX) format, entries in this order:
//
//  1. kibotos-transfer.json: the manifest, {"format": "kibotos.transfer.v1",
//     "manifest": <the TransferManifest in protobuf JSON>, "filesystems":
//     {"layer": <layout>, "volume": <layout>}}. A layout is the geometry
//     of the ext4 filesystem the section was read from (the host's
//     diskimage.Geometry in JSON: block and inode sizes, inode count,
//     blocks per group, journal, reserved descriptor blocks), which a
//     restore gives the filesystem it makes of the same size, so that
//     what filled the exported one fits (mkfs lays a filesystem out by
//     its size, and one that grew keeps the layout of its first size).
//     "filesystems" is optional: without it a restore lets mkfs choose.
//  2. layer, layer/...: the writable layer's overlay upper directory, the
//     guest's "/" as written over the Template; then volume, volume/...:
//     the Volume's root; then, when the manifest says carries_template,
//     template/...: an OCI image layout of the Template revision's image
//     (oci-layout, blobs/sha256/<hex>, index.json), checked blob by blob
//     against its digests (template.go).
//     Directories precede what they hold; sockets are not carried.
//  3. kibotos-transfer.sums: the trailer, one line "<sha256 hex> <name>"
//     per regular file in entry order, then "entries <n>" counting every
//     entry before it. An archive without it, or whose sums or count
//     disagree with what precedes it, is refused; nothing may follow it.
//
// Each entry keeps its type (directory, regular file, symbolic link, hard
// link to an earlier entry of the same section other than a directory, as
// a reader checks, character or block device, fifo), permission and set-id/sticky bits, numeric owner and group, and
// modification time to the nanosecond; device numbers for devices (overlay
// whiteouts are character devices 0/0). Extended attributes travel as PAX
// records SCHILY.xattr.<name> with their raw values (trusted.overlay.opaque
// marks an opaque directory), except trusted.overlay.origin and
// trusted.overlay.impure, which name inodes of the exporting host.
//
// A regular file with holes (found with SEEK_DATA/SEEK_HOLE) stores only
// its data: the entry's content is the data extents concatenated, its size
// their total, and the PAX record KIBOTOS.sparse holds
// "<logical size>:<offset>,<length>,<offset>,<length>,..." (possibly with
// no extent). Extraction truncates the file to its logical size and writes
// each extent at its offset, so holes stay holes. archive/tar reads GNU
// sparse files but writes none, hence this record; an entry with GNU
// sparse records (GNU.sparse.*) is refused, as archive/tar would read its
// holes as zeros up to any size its header claims.
//
// Entry names are slash-separated, relative, clean and without "..";
// the path inside the section (a hard link's target's too) and a
// symbolic link's target are at most 4095 bytes (PATH_MAX less its NUL,
// the longest path Linux takes in one call): a reader refuses anything
// else. The writer walks a tree, and the extractor fills one, relative to
// directory descriptors, so every path that short is carried however deep
// the tree's root sits on the host, and a longer one (which a guest makes
// only by working in relative paths) fails the export. The extractor
// creates every entry through openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS),
// so no link in the archive can make it write outside the directory it
// extracts into.
package artifact

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Format names this version of the format.
const Format = "kibotos.transfer.v1"

// Names of the archive's fixed entries and sections.
const (
	ManifestName = "kibotos-transfer.json"
	TrailerName  = "kibotos-transfer.sums"
	// Layer, Volume and Template are the sections.
	Layer    = "layer"
	Volume   = "volume"
	Template = "template"
)

// PAX record keys of the format.
const (
	paxSparse = "KIBOTOS.sparse"
	paxXattr  = "SCHILY.xattr."
)

// sumLine is the trailer's line of a regular file name whose content
// hashes to sum.
func sumLine(sum []byte, name string) string {
	return hex.EncodeToString(sum) + " " + name + "\n"
}

// entriesLine ends the trailer, counting the entries before it.
func entriesLine(entries int) string {
	return "entries " + strconv.Itoa(entries) + "\n"
}

// ErrInvalid marks every error about the artifact's content (as opposed
// to an error reading it or writing where it goes): a truncated,
// corrupted or foreign file.
var ErrInvalid = errors.New("invalid transfer artifact")

// invalid returns an error wrapping ErrInvalid.
func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// envelope is the manifest entry's JSON.
type envelope struct {
	Format   string          `json:"format"`
	Manifest json.RawMessage `json:"manifest"`
	// Filesystems are the layouts of the filesystems the sections were
	// read from, by section, as the exporting host recorded them.
	Filesystems map[string]json.RawMessage `json:"filesystems,omitempty"`
}

// EncodeManifest returns the manifest entry's content for m.
func EncodeManifest(m *ctrlv1.TransferManifest) ([]byte, error) {
	inner, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.Marshal(envelope{Format: Format, Manifest: inner})
}

// DecodeManifest reads the manifest entry's content.
func DecodeManifest(b []byte) (*ctrlv1.TransferManifest, error) {
	env, err := decodeEnvelope(b)
	if err != nil {
		return nil, err
	}
	m := new(ctrlv1.TransferManifest)
	if err := protojson.Unmarshal(env.Manifest, m); err != nil {
		return nil, invalid("its manifest does not parse: %v", err)
	}
	return m, nil
}

func decodeEnvelope(b []byte) (envelope, error) {
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return env, invalid("its manifest is not JSON: %v", err)
	}
	if env.Format != Format {
		return env, invalid("its format is %q, not %q", env.Format, Format)
	}
	return env, nil
}

// WithFilesystems returns the manifest entry's content b with the layouts
// of the sections' filesystems added: what a restore needs to make
// filesystems that hold what these held (see the package doc).
func WithFilesystems(b []byte, filesystems map[string]json.RawMessage) ([]byte, error) {
	env, err := decodeEnvelope(b)
	if err != nil {
		return nil, err
	}
	env.Filesystems = filesystems
	return json.Marshal(env)
}
