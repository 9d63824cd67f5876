package netslot

import (
	"fmt"
	"os"
	"reflect"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/link/stopfd"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// newTUNLink serves the TUN device whose queues are the files queues as a
// link endpoint, each queue with a reader of its own. It returns the
// endpoint with the stop eventfds of its packet dispatchers, which the
// caller closes (closeStopFDs) once the endpoint is detached.
//
// fdbased gives each of its packet dispatchers an eventfd that tells the
// dispatcher to stop reading, and the pinned gVisor version never closes
// it (the endpoint's Close does nothing). No API exposes these eventfds, so
// they are read from the endpoint's unexported fields, and each is checked
// to be an eventfd. A gVisor version that closes them itself would make
// closeStopFDs fail with EBADF (and the slot's tests with it): this goes
// then.
func newTUNLink(queues []*os.File) (stack.LinkEndpoint, []int, error) {
	// The kernel checksums what a TUN device without offloads receives, so
	// checking again here is redundant; a guest that sent bad checksums
	// would only corrupt its own connections.
	fds := make([]int, len(queues))
	for i, q := range queues {
		fds[i] = int(q.Fd())
	}
	ep, err := fdbased.New(&fdbased.Options{FDs: fds, MTU: MTU, RXChecksumOffload: true})
	if err != nil {
		return nil, nil, err
	}
	stopFDs, err := dispatcherStopFDs(ep)
	if err != nil {
		return nil, nil, fmt.Errorf("link: %w", err)
	}
	return ep, stopFDs, nil
}

// dispatcherStopFDs returns the stop eventfds of ep's packet dispatchers.
func dispatcherStopFDs(ep stack.LinkEndpoint) ([]int, error) {
	dispatchers := reflect.ValueOf(ep).Elem().FieldByName("inboundDispatchers")
	if dispatchers.Kind() != reflect.Slice {
		return nil, fmt.Errorf("%T has no packet dispatchers", ep)
	}
	stopFDType := reflect.TypeOf(stopfd.StopFD{})
	fds := make([]int, 0, dispatchers.Len())
	for i := range dispatchers.Len() {
		// An interface holding a pointer to the dispatcher.
		d := dispatchers.Index(i).Elem()
		if d.Kind() != reflect.Pointer || d.Elem().Kind() != reflect.Struct {
			return nil, fmt.Errorf("unexpected packet dispatcher %s", d.Type())
		}
		stop := d.Elem().FieldByName("StopFD")
		if !stop.IsValid() || stop.Type() != stopFDType {
			return nil, fmt.Errorf("packet dispatcher %s has no stop eventfd", d.Type())
		}
		fd := int(stop.FieldByName("EFD").Int())
		if target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err != nil || target != "anon_inode:[eventfd]" {
			return nil, fmt.Errorf("stop descriptor %d of packet dispatcher %s is not an eventfd (%q, %v)", fd, d.Type(), target, err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// closeStopFDs closes the stop eventfds newTUNLink returned. The link's
// dispatchers must have stopped: it is detached (its NIC removed) or was
// never attached.
func closeStopFDs(fds []int) error {
	var err error
	for _, fd := range fds {
		if cerr := unix.Close(fd); cerr != nil && err == nil {
			err = fmt.Errorf("close stop eventfd %d: %w", fd, cerr)
		}
	}
	return err
}

// stopReaders stops the link's readers (the dispatchers of the queues
// whose stop eventfds are stopFDs) and waits for them to end. Removing the
// NIC does the same, but while it holds the endpoint's lock, which a reader
// that delivers its packets itself (one packet processor per queue) takes
// for each packet: a packet arriving then would leave both waiting for
// each other. After stopReaders, the NIC's removal finds them ended.
//
// A reader sees its stop eventfd only when its queue runs dry, which a
// guest sending without pause would delay for as long as it sends: each
// queue is first detached from the device (IFF_DETACH_QUEUE), so that its
// reader's next read fails at once. A single-queue device refuses that,
// and its reader stops as it did before there were several.
func stopReaders(link stack.LinkEndpoint, stopFDs []int, queues []*os.File) {
	detach, _ := unix.NewIfreq("")
	detach.SetUint16(unix.IFF_DETACH_QUEUE)
	for _, q := range queues {
		unix.IoctlIfreq(int(q.Fd()), unix.TUNSETQUEUE, detach)
	}
	increment := []byte{1, 0, 0, 0, 0, 0, 0, 0} // adds 1 to the counter, as gVisor's own Stop does
	for _, fd := range stopFDs {
		unix.Write(fd, increment)
	}
	link.Wait()
}
