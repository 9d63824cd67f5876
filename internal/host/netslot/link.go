package netslot

import (
	"fmt"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/rawfile"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// tunLink is the link endpoint of the guest's TUN device: one reader
// goroutine per queue delivers what the guest sends to the stack, and the
// stack's packets are written to a queue at once, on the writer's
// goroutine, except those that go apart (txQueue).
//
// The readers wait in Go's poller, which holds no thread and no P while a
// queue is dry. gVisor's fdbased endpoint waits in ppoll(2) instead, as a
// syscall that keeps its P: with a reader per queue and as many Ps as
// queues, a goroutine that a packet made runnable (the handler of a new
// connection) waited for the runtime's monitor to take a P back, about
// 100 µs per connection.
type tunLink struct {
	queues []*os.File
	// tx are the queues' transmit sides, in the order of queues.
	tx []txQueue

	dispatcher atomic.Pointer[stack.NetworkDispatcher]
	readers    sync.WaitGroup
	drains     sync.WaitGroup // txQueue.drain's
	startOnce  sync.Once
	stopOnce   sync.Once
	onClose    func()
}

// How a reader holds a packet it read. The stack counts a packet's length
// against its connection's receive buffer, so the memory that holds a
// packet must be little more than its length, or a guest whose connections
// stall makes the host hold several times their bounds (a 17 KB segment
// holding the 64 KiB read buffer: four times).
const (
	// keepBuffer is the smallest packet that keeps the read buffer (the
	// MTU's size, at most a third more than the packet) as its memory, and
	// the reader takes a new buffer. A smaller packet is copied.
	keepBuffer = 48 << 10
	// wholeCopy is the largest packet copied into one chunk of its size
	// rounded up to a power of two; a larger one is cut into chunks of
	// powers of two.
	wholeCopy = 2 << 10
)

// newTUNLink serves the TUN device whose queues are the files queues,
// which must be non-blocking (so that Go's poller serves them); its
// readers start when the stack attaches it.
func newTUNLink(queues []*os.File) (*tunLink, error) {
	l := &tunLink{queues: queues, tx: make([]txQueue, len(queues))}
	for i, q := range queues {
		// A file the poller does not serve takes no deadline, which is
		// how stop ends a reader.
		if err := q.SetReadDeadline(time.Time{}); err != nil {
			return nil, fmt.Errorf("link: queue %d is not served by the poller: %w", i, err)
		}
		rc, err := q.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("link: queue %d: %w", i, err)
		}
		if err := rc.Control(func(fd uintptr) { l.tx[i].fd = int(fd) }); err != nil {
			return nil, fmt.Errorf("link: queue %d: %w", i, err)
		}
	}
	return l, nil
}

// read delivers the packets of queue q until stop.
func (l *tunLink) read(q *os.File) {
	defer l.readers.Done()
	rc, err := q.SyscallConn()
	if err != nil {
		return
	}
	buf := buffer.NewViewSize(vnetHdrLen + MTU)
	defer func() { buf.Release() }()
	var n int
	var rerr error
	readOne := func(fd uintptr) bool {
		n, rerr = unix.Read(int(fd), buf.AsSlice())
		return rerr != unix.EAGAIN // wait in the poller
	}
	for {
		if err := rc.Read(readOne); err != nil {
			return // stopped, or the queue closed
		}
		if rerr == unix.EINTR {
			continue
		}
		if rerr != nil || n == 0 {
			return
		}
		// The device offers no segmentation offload, so the guest's
		// kernel sends none; what claims otherwise is dropped.
		if n <= vnetHdrLen || decodeVnetHdr(buf.AsSlice()).gsoType != unix.VIRTIO_NET_HDR_GSO_NONE {
			continue
		}
		packet := buf.AsSlice()[vnetHdrLen:n]
		var proto tcpip.NetworkProtocolNumber
		switch header.IPVersion(packet) {
		case header.IPv4Version:
			proto = header.IPv4ProtocolNumber
		case header.IPv6Version:
			proto = header.IPv6ProtocolNumber
		default:
			continue // neither IPv4 nor IPv6
		}
		var payload buffer.Buffer
		if len(packet) >= keepBuffer {
			v := buf
			buf = buffer.NewViewSize(vnetHdrLen + MTU)
			v.CapLength(n)
			v.TrimFront(vnetHdrLen)
			payload = buffer.MakeWithView(v)
		} else {
			payload = copyPacket(packet)
		}
		l.deliver(proto, payload)
	}
}

// copyPacket copies b into chunks each a power of two long, largest first,
// the last (at most wholeCopy bytes) rounded up to one: the copy holds
// little more memory than len(b).
func copyPacket(b []byte) buffer.Buffer {
	var out buffer.Buffer
	for len(b) > wholeCopy {
		size := 1 << (bits.Len(uint(len(b))) - 1)
		out.Append(buffer.NewViewWithData(b[:size]))
		b = b[size:]
	}
	if len(b) > 0 {
		out.Append(buffer.NewViewWithData(b))
	}
	return out
}

// deliver hands the stack payload, an IP packet of protocol proto with no
// link header.
func (l *tunLink) deliver(proto tcpip.NetworkProtocolNumber, payload buffer.Buffer) {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: payload})
	pkt.NetworkProtocolNumber = proto
	if d := l.dispatcher.Load(); d != nil {
		(*d).DeliverNetworkPacket(proto, pkt)
	}
	pkt.DecRef()
}

// stop ends the readers and waits for them. A reader ends at once, even
// while the guest floods its queue: the poller checks the deadline before
// each read. The slot stops them before removing the NIC: the NIC's
// removal holds locks that a packet being delivered may wait for.
func (l *tunLink) stop() {
	l.stopOnce.Do(func() {
		for _, q := range l.queues {
			q.SetReadDeadline(time.Unix(1, 0))
		}
	})
	l.readers.Wait()
}

// txQueue is the transmit side of one TUN queue. A packet is written on
// the goroutine that sends it, unless it goes apart or packets already
// wait; then a drain goroutine writes it, behind those, so the packets of
// a flow keep their order.
//
// A packet goes apart when writing it on the sender's goroutine costs the
// most:
//   - a SYN-ACK. The stack writes it holding the new connection's lock,
//     and the guest's kernel answers within the write: the ACK is read and
//     handed to the TCP processor before the write returns, and the
//     processor spins on that lock until it does (a third of the CPU of
//     the connection row). Written apart, the lock is free by the time the
//     ACK arrives.
//   - a bulk segment (bulkPacket and up). Writing one runs the guest's
//     receive path in the kernel, as long as the copy that made the
//     segment: written apart, a stream toward the guest reads its next
//     bytes from the host while the last are written.
type txQueue struct {
	// fd is the queue's descriptor, for writing without the poller: a TUN
	// device takes a write at once. It stays valid until the slot closes
	// the queues, after the stack and every drain have stopped.
	fd int

	mu       sync.Mutex
	waiting  []*stack.PacketBuffer // each holds a reference of its own
	draining bool                  // a drain goroutine runs
}

const (
	// bulkPacket is the size from which a packet goes apart.
	bulkPacket = 16 << 10
	// maxWaiting bounds the packets waiting for a queue's drain; a packet
	// beyond it is dropped, as a full device queue drops, and TCP sends it
	// again.
	maxWaiting = 512
)

// send writes pkt to the queue of its flow, as the kernel spreads the
// guest's flows over the queues, or hands it to the queue's drain.
func (l *tunLink) send(pkt *stack.PacketBuffer) tcpip.Error {
	q := &l.tx[pkt.Hash%uint32(len(l.tx))]
	apart := isSynAck(pkt) || pkt.Size() >= bulkPacket
	q.mu.Lock()
	if !apart && !q.draining {
		q.mu.Unlock()
		return q.write(pkt)
	}
	if len(q.waiting) >= maxWaiting {
		q.mu.Unlock()
		return &tcpip.ErrNoBufferSpace{}
	}
	q.waiting = append(q.waiting, pkt.IncRef())
	if !q.draining {
		q.draining = true
		l.drains.Add(1)
		go l.drain(q)
	}
	q.mu.Unlock()
	return nil
}

// drain writes q's waiting packets until none is left. A packet the device
// refuses is lost, as on any link; TCP sends it again.
func (l *tunLink) drain(q *txQueue) {
	defer l.drains.Done()
	var batch []*stack.PacketBuffer
	for {
		q.mu.Lock()
		batch, q.waiting = q.waiting, batch[:0]
		if len(batch) == 0 {
			q.draining = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		for i, pkt := range batch {
			q.write(pkt)
			pkt.DecRef()
			batch[i] = nil
		}
	}
}

// write writes one packet to the queue.
func (q *txQueue) write(pkt *stack.PacketBuffer) tcpip.Error {
	views := pkt.AsSlices()
	var arr [8]unix.Iovec
	iovecs := arr[:0]
	for _, v := range views {
		iovecs = rawfile.AppendIovecFromBytes(iovecs, v, rawfile.MaxIovs)
	}
	if errno := rawfile.NonBlockingWriteIovec(q.fd, iovecs); errno != 0 {
		return tcpip.TranslateErrno(errno)
	}
	return nil
}

// inject writes the IP packet b, checksums complete, to the guest around
// the stack. A packet the device refuses is lost, as on any link.
func (l *tunLink) inject(b []byte) {
	var hdr [vnetHdrLen]byte
	unix.Writev(l.tx[0].fd, [][]byte{hdr[:], b})
}

// WritePackets implements stack.LinkWriter.
func (l *tunLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		if err := l.send(pkt); err != nil {
			if n == 0 {
				return 0, err
			}
			break
		}
		n++
	}
	return n, nil
}

// isSynAck reports whether pkt is a TCP SYN-ACK.
func isSynAck(pkt *stack.PacketBuffer) bool {
	if pkt.TransportProtocolNumber != header.TCPProtocolNumber {
		return false
	}
	h := pkt.TransportHeader().Slice()
	return len(h) >= header.TCPMinimumSize && header.TCP(h).Flags() == header.TCPFlagSyn|header.TCPFlagAck
}

// Attach implements stack.NetworkLinkEndpoint: the first dispatcher
// starts the readers; nil (the NIC's removal) stops them.
func (l *tunLink) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		l.dispatcher.Store(nil)
		l.stop()
		return
	}
	l.dispatcher.Store(&d)
	l.startOnce.Do(func() {
		for _, q := range l.queues {
			l.readers.Add(1)
			go l.read(q)
		}
	})
}

// IsAttached implements stack.NetworkLinkEndpoint.
func (l *tunLink) IsAttached() bool { return l.dispatcher.Load() != nil }

// Wait implements stack.NetworkLinkEndpoint: it waits for the readers,
// which end once stopped, and for the drains under way. The slot calls it
// once the stack has stopped writing, before it closes the queues.
func (l *tunLink) Wait() {
	l.readers.Wait()
	l.drains.Wait()
}

// MTU implements stack.NetworkLinkEndpoint.
func (l *tunLink) MTU() uint32 { return MTU }

// SetMTU implements stack.NetworkLinkEndpoint; the link's MTU is fixed.
func (l *tunLink) SetMTU(uint32) {}

// MaxHeaderLength implements stack.NetworkLinkEndpoint: the link header is
// the device's virtio_net_hdr.
func (l *tunLink) MaxHeaderLength() uint16 { return vnetHdrLen }

// LinkAddress implements stack.NetworkLinkEndpoint: none.
func (l *tunLink) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.NetworkLinkEndpoint; there is none.
func (l *tunLink) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.NetworkLinkEndpoint. The stack does not
// check the checksums of what the guest sends: its kernel leaves them
// partial (vnet.go), and a guest that sent bad ones would only corrupt its
// own connections.
func (l *tunLink) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload
}

// SupportedGSO implements stack.GSOEndpoint: the stack builds TCP segments
// for offload, which leaves their checksums to the guest's kernel.
func (l *tunLink) SupportedGSO() stack.SupportedGSO { return stack.HostGSOSupported }

// GSOMaxSize implements stack.GSOEndpoint. The stack fills a segment up to
// this size less 161 bytes (header.TCPTotalHeaderMaximumSize and one): at
// the link's MTU that is under the MSS of either IP version, options
// included, so the guest's kernel has no segment to cut unless the guest's
// MSS is smaller (a lower MTU, a clamped MSS).
func (l *tunLink) GSOMaxSize() uint32 { return MTU }

// ARPHardwareType implements stack.NetworkLinkEndpoint.
func (l *tunLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.NetworkLinkEndpoint: it pushes the packet's
// virtio_net_hdr.
func (l *tunLink) AddHeader(pkt *stack.PacketBuffer) {
	vnetHdrOf(pkt).encode(pkt.LinkHeader().Push(vnetHdrLen))
}

// ParseHeader implements stack.NetworkLinkEndpoint. The readers strip the
// device's header before the stack sees a packet.
func (l *tunLink) ParseHeader(*stack.PacketBuffer) bool { return true }

// Close implements stack.NetworkLinkEndpoint. The slot owns and closes the
// queues.
func (l *tunLink) Close() {
	if l.onClose != nil {
		l.onClose()
	}
}

// SetOnCloseAction implements stack.NetworkLinkEndpoint.
func (l *tunLink) SetOnCloseAction(f func()) { l.onClose = f }
