package netslot

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// VnetHdrLen is the length of the virtio_net_hdr before each packet on a
// slot's TUN device.
const VnetHdrLen = vnetHdrLen

// VnetHdr is a decoded virtio_net_hdr.
type VnetHdr struct {
	Flags, GSOType                         uint8
	HdrLen, GSOSize, CsumStart, CsumOffset uint16
}

// DecodeVnetHdr reads the virtio_net_hdr that starts b.
func DecodeVnetHdr(b []byte) VnetHdr {
	h := decodeVnetHdr(b)
	return VnetHdr{h.flags, h.gsoType, h.hdrLen, h.gsoSize, h.csumStart, h.csumOffset}
}

// SetTimeWait sets how long the stack of s keeps a connection its side
// closed first in TIME_WAIT, so that a test can meet the state at will.
func SetTimeWait(s *Slot, d time.Duration) {
	tw := tcpip.TCPTimeWaitTimeoutOption(d)
	if err := s.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &tw); err != nil {
		panic(err)
	}
}
