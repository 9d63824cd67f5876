package netslot

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Every packet on the slot's TUN device starts with a struct virtio_net_hdr
// (the device is made with IFF_VNET_HDR), which carries checksum offload
// between the guest's kernel and the stack:
//
//   - The stack leaves a TCP segment's checksum to the guest's kernel: it
//     writes the pseudo-header's sum in the checksum field and the header
//     says where the sum over the segment would go (NEEDS_CSUM, which the
//     kernel calls CHECKSUM_PARTIAL). A kernel delivering such a packet to
//     a local socket trusts it, as it trusts its own loopback; one that
//     forwards it (a bridge in the guest) completes the checksum first. The
//     stack so no longer sums every byte it sends the guest.
//   - The guest's kernel, told the device takes partial checksums
//     (TUN_F_CSUM), leaves its own to the slot, and the stack does not
//     check what it receives (CapabilityRXChecksumOffload).
//
// The header's fields are in the host's byte order (a legacy virtio
// header, which is what a TUN device uses unless told otherwise).
const vnetHdrLen = 10

// vnetHdr is a struct virtio_net_hdr.
type vnetHdr struct {
	flags      uint8
	gsoType    uint8
	hdrLen     uint16
	gsoSize    uint16
	csumStart  uint16
	csumOffset uint16
}

// encode writes h to b, which is vnetHdrLen long.
func (h vnetHdr) encode(b []byte) {
	b[0] = h.flags
	b[1] = h.gsoType
	binary.NativeEndian.PutUint16(b[2:], h.hdrLen)
	binary.NativeEndian.PutUint16(b[4:], h.gsoSize)
	binary.NativeEndian.PutUint16(b[6:], h.csumStart)
	binary.NativeEndian.PutUint16(b[8:], h.csumOffset)
}

// vnetHdrOf is the header of a packet the stack writes: a TCP segment
// built for offload (the link's SupportedGSO) asks for its checksum, and
// one larger than its MSS (a guest whose MSS is smaller) is also to be cut
// into segments of that size by the guest's kernel. Any other packet
// carries its checksums whole and a header of zeros.
func vnetHdrOf(pkt *stack.PacketBuffer) vnetHdr {
	gso := pkt.GSOOptions
	if gso.Type == stack.GSONone || !gso.NeedsCsum {
		return vnetHdr{}
	}
	l3 := len(pkt.NetworkHeader().Slice())
	h := vnetHdr{
		flags:      unix.VIRTIO_NET_HDR_F_NEEDS_CSUM,
		csumStart:  uint16(l3),
		csumOffset: gso.CsumOffset,
	}
	if pkt.Data().Size() > int(gso.MSS) {
		switch gso.Type {
		case stack.GSOTCPv4:
			h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV4
		case stack.GSOTCPv6:
			h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV6
		}
		h.gsoSize = gso.MSS
		h.hdrLen = uint16(l3 + len(pkt.TransportHeader().Slice()))
	}
	return h
}

// decodeVnetHdr reads the header that starts b, which is at least
// vnetHdrLen long.
func decodeVnetHdr(b []byte) vnetHdr {
	return vnetHdr{
		flags:      b[0],
		gsoType:    b[1],
		hdrLen:     binary.NativeEndian.Uint16(b[2:]),
		gsoSize:    binary.NativeEndian.Uint16(b[4:]),
		csumStart:  binary.NativeEndian.Uint16(b[6:]),
		csumOffset: binary.NativeEndian.Uint16(b[8:]),
	}
}
