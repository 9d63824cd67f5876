package netslot_test

import (
	"testing"

	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

func traffic(t *testing.T, s *netslot.Slot) netslot.Traffic {
	t.Helper()
	tr, err := netslot.ReadTraffic(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestSlotTraffic: the slot's counters are the guest's own, received
// being what reached the guest: a DNS exchange raises both, and what the
// guest reads lies between the slot's reads before and after it.
func TestSlotTraffic(t *testing.T) {
	s := newSlot(t)
	before := traffic(t, s)
	dnsRefused(t, s, "10.211.0.1:53")
	received, sent := nettest.LinkBytes(t, s.Path())
	after := traffic(t, s)
	if received <= before.ReceivedBytes || received > after.ReceivedBytes {
		t.Errorf("the guest received %d bytes; the slot counted %d before the exchange, %d after", received, before.ReceivedBytes, after.ReceivedBytes)
	}
	if sent <= before.SentBytes || sent > after.SentBytes {
		t.Errorf("the guest sent %d bytes; the slot counted %d before the exchange, %d after", sent, before.SentBytes, after.SentBytes)
	}
}
