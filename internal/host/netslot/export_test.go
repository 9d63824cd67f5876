package netslot

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// SetTimeWait sets how long the stack of s keeps a connection its side
// closed first in TIME_WAIT, so that a test can meet the state at will.
func SetTimeWait(s *Slot, d time.Duration) {
	tw := tcpip.TCPTimeWaitTimeoutOption(d)
	if err := s.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &tw); err != nil {
		panic(err)
	}
}
