package netslot_test

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/netnsfile"
	"github.com/kibotos/kibotos/internal/host/netpolicy"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// openFiles counts the process's open file descriptors by what they refer
// to: "anon_inode:[eventfd]", "/dev/net/tun", "socket", "net" (namespace
// handles), and so on.
func openFiles(t *testing.T) map[string]int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		// "socket:[123]" and "net:[4026531840]" name one object each; count
		// them by type.
		kind, _, _ := strings.Cut(target, ":[")
		if strings.HasPrefix(target, "anon_inode:") {
			kind = target
		}
		kinds[kind]++
	}
	return kinds
}

// TestSlotCyclesReleaseEverything creates, closes, reopens and destroys
// slots, with a connection open through each when it closes, and checks
// that the process holds no more descriptors than before and not one more
// goroutine per cycle.
func TestSlotCyclesReleaseEverything(t *testing.T) {
	inet := nettest.NewInternet(t)
	l := inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	// served tells that the destination's end of a connection closed.
	served := make(chan struct{})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				// Plain reads and writes: splicing would keep pipes in a
				// process-wide pool.
				io.Copy(struct{ io.Writer }{c}, struct{ io.Reader }{c})
				c.Close()
				served <- struct{}{}
			}()
		}
	}()
	dst := netip.AddrPortFrom(nettest.HostIPv4, uint16(l.Addr().(*net.TCPAddr).Port))
	const cycles = 10
	cycle := func(i int) {
		cfg := netslot.Config{
			Path:     filepath.Join(t.TempDir(), fmt.Sprintf("slot%d", i)),
			HardDeny: netpolicy.HardDeny{Exempt: nettest.ExemptRanges},
		}
		s, err := netslot.Create(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.Apply(policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0))
		c, err := dial(t, s, dst)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := roundTrip(c, "hello"); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		<-served // closing the slot ended the connection
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if s, err = netslot.Open(cfg); err != nil {
			t.Fatal(err)
		}
		if err := s.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	// The first cycle starts what lives as long as the process (the
	// runtime's poller, netlink's and gVisor's package state).
	cycle(-1)
	filesBefore, goroutinesBefore := openFiles(t), runtime.NumGoroutine()
	for i := range cycles {
		cycle(i)
	}
	filesAfter, goroutinesAfter := openFiles(t), runtime.NumGoroutine()
	t.Logf("after %d cycles: descriptors %v (before %v), goroutines %d (before %d)", cycles, filesAfter, filesBefore, goroutinesAfter, goroutinesBefore)
	for kind, n := range filesAfter {
		if n > filesBefore[kind] {
			t.Errorf("%d cycles left %d more %q descriptors (%d before)", cycles, n-filesBefore[kind], kind, filesBefore[kind])
		}
	}
	// A goroutine that ended its work may not have exited yet; one left
	// per cycle is a leak.
	if goroutinesAfter-goroutinesBefore >= cycles {
		t.Errorf("%d cycles left %d more goroutines (%d before)", cycles, goroutinesAfter-goroutinesBefore, goroutinesBefore)
	}
}

// TestSlotClosesUnderEchoes closes slots while their guest sends echo
// requests that the slot answers itself (an Egress covers the
// destination): an answer being injected must not meet the closing of the
// TUN device. The race detector (go test -race) sees it when it does.
func TestSlotClosesUnderEchoes(t *testing.T) {
	hosttest.RequireRoot(t)
	n := policy(1, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, 0)
	n.Policy.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: "eg", Destinations: []string{"198.51.100.0/24"}}}
	n.Egresses = []*hostv1.EgressAssignment{{EgressId: "eg", Revision: 1, Spec: &ctrlv1.EgressSpec{
		Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:1"}}}}}
	request, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: 77, Seq: 1}}).Marshal(nil)
	for i := range 20 {
		s, err := netslot.Create(netslot.Config{Path: filepath.Join(t.TempDir(), fmt.Sprintf("slot%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		s.Apply(n)
		var c *icmp.PacketConn
		if err := netnsfile.Do(s.Path(), func() (err error) {
			c, err = icmp.ListenPacket("ip4:icmp", "")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		sending := make(chan struct{})
		go func() {
			defer close(sending)
			for {
				// Fails once the slot is gone and its link with it.
				if _, err := c.WriteTo(request, &net.IPAddr{IP: net.IPv4(198, 51, 100, 1)}); err != nil {
					return
				}
			}
		}()
		// Answers arrive: the slot is injecting.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := c.ReadFrom(make([]byte, 1500)); err != nil {
			t.Fatal(err)
		}
		if err := s.Destroy(); err != nil {
			t.Error(err)
		}
		c.Close()
		<-sending
	}
}

// An idle slot holds no OS thread: its link's readers wait in Go's poller.
// A reader waiting in a system call of its own (gVisor's fdbased waits in
// ppoll) kept a thread per queue, two per idle workspace on a host.
func TestIdleSlotsHoldNoThreads(t *testing.T) {
	const slots = 20
	before := hosttest.Threads(t)
	for range slots {
		newSlot(t)
	}
	// The readers settle into waiting, and the runtime may start a few
	// threads of its own meanwhile; a thread held per reader stays.
	grown := hosttest.Threads(t) - before
	for deadline := time.Now().Add(10 * time.Second); grown >= slots/2 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		grown = hosttest.Threads(t) - before
	}
	if grown >= slots/2 {
		t.Errorf("%d idle slots: the process has %d more threads (before %d)", slots, grown, before)
	}
}
