package agent

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// frames returns what a guest's connection sends: the frames write makes.
func frames(t *testing.T, write func(*http2.Framer) error) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := write(http2.NewFramer(&b, nil)); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// followIn feeds b to c in reads of n bytes and returns the first error.
func followIn(c *frameBudgetConn, b []byte, n int) error {
	for len(b) > 0 {
		k := min(n, len(b))
		if err := c.frames.follow(b[:k], c.spend); err != nil {
			return err
		}
		b = b[k:]
	}
	return nil
}

// TestFrameBudget: a guest's connection may send the frames of its calls
// (window updates included) without end, and control frames (PINGs, SETTINGS, empty DATA) up to
// controlFrameBurst at once and controlFramesPerSecond after; one more
// closes it, however its bytes are split into reads.
func TestFrameBudget(t *testing.T) {
	pings := func(n int) []byte {
		return frames(t, func(f *http2.Framer) error {
			for range n {
				if err := f.WritePing(false, [8]byte{1}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	calls := frames(t, func(f *http2.Framer) error {
		for i := range 50_000 {
			if err := f.WriteData(uint32(2*i+1), i%2 == 0, []byte("x")); err != nil {
				return err
			}
			// What a guest reading an upload sends, a few times a read.
			if err := f.WriteWindowUpdate(0, 1<<10); err != nil {
				return err
			}
		}
		return f.WriteData(1, true, nil) // an empty DATA that ends its stream
	})
	for _, read := range []int{1, 7, 4096} {
		// Refilled in the future: nothing comes back while the test runs.
		c := newFrameBudgetConn(nil, nil, controlFrameBurst, time.Now().Add(time.Hour))
		if err := followIn(c, calls, read); err != nil {
			t.Fatalf("reads of %d: the frames of calls: %v", read, err)
		}
		if err := followIn(c, pings(controlFrameBurst), read); err != nil {
			t.Fatalf("reads of %d: a burst of %d PINGs: %v", read, controlFrameBurst, err)
		}
		if err := followIn(c, pings(1), read); !errors.Is(err, errControlFrames) {
			t.Fatalf("reads of %d: a PING past the burst: %v", read, err)
		}
	}
	// The budget refills at its rate: two seconds later, about 2,000 more.
	c := newFrameBudgetConn(nil, nil, 0, time.Now().Add(-2*time.Second))
	if err := followIn(c, pings(1900), 4096); err != nil {
		t.Fatalf("PINGs within the refill: %v", err)
	}
	if err := followIn(c, pings(200), 4096); !errors.Is(err, errControlFrames) {
		t.Fatalf("PINGs past the refill: %v", err)
	}
	// Empty DATA frames that end nothing count as control frames.
	c = newFrameBudgetConn(nil, nil, 3, time.Now().Add(time.Hour))
	empty := frames(t, func(f *http2.Framer) error {
		for range 4 {
			if err := f.WriteData(1, false, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err := followIn(c, empty, 4096); !errors.Is(err, errControlFrames) {
		t.Fatalf("empty DATA frames past the budget: %v", err)
	}
}
