package netslot

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Traffic is what crossed a slot's link, from the guest's side.
type Traffic struct {
	// ReceivedBytes were delivered to the guest; SentBytes the guest sent.
	ReceivedBytes, SentBytes uint64
}

// ReadTraffic reads the byte counters of the guest's link in the slot
// namespace bound at path, as the guest's kernel counts them on its
// interface (what /proc/net/dev shows inside): every packet since the
// namespace was created, those a slot writes around its stack (ICMP
// answers) included, whether or not a Slot serves it now (after a restart
// of the host agent, say).
func ReadTraffic(path string) (Traffic, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return Traffic{}, fmt.Errorf("network slot: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return Traffic{}, fmt.Errorf("network slot: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(ifName)
	if err != nil {
		return Traffic{}, fmt.Errorf("network slot: %w", err)
	}
	st := link.Attrs().Statistics
	if st == nil {
		return Traffic{}, fmt.Errorf("network slot: the kernel gave no counters of %s", ifName)
	}
	return Traffic{ReceivedBytes: st.RxBytes, SentBytes: st.TxBytes}, nil
}
