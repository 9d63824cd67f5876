package scheduler

import (
	"errors"
	"slices"
	"testing"
)

func TestPlace(t *testing.T) {
	const gib = 1 << 30
	hosts := []Host{
		{ID: "small", Capacity: Resources{2000, 2 * gib, 10 * gib}, DefaultLayerBytes: gib},
		{ID: "big", Capacity: Resources{4000, 8 * gib, 10 * gib}, Reserved: Resources{1000, 2 * gib, 9 * gib}, DefaultLayerBytes: 512 << 20},
	}
	cases := []struct {
		name      string
		req       Request
		wantHost  string
		wantLayer uint64
		wantErr   bool
	}{
		{"most free memory wins", Request{1000, gib, 0}, "big", 512 << 20, false},
		{"explicit layer size", Request{1000, gib, gib}, "big", gib, false},
		{"disk rules out big", Request{1000, gib, 2 * gib}, "small", 2 * gib, false},
		{"memory rules out small", Request{1000, 4 * gib, 0}, "big", 512 << 20, false},
		{"cpu fits nowhere", Request{5000, gib, 0}, "", 0, true},
		{"exactly full fits", Request{3000, 6 * gib, gib}, "big", gib, false},
	}
	for _, c := range cases {
		host, layer, err := Place(hosts, c.req)
		if (err != nil) != c.wantErr || host != c.wantHost || layer != c.wantLayer {
			t.Errorf("%s: Place = %q, %d, %v; want %q, %d, err %v", c.name, host, layer, err, c.wantHost, c.wantLayer, c.wantErr)
		}
	}
	if _, _, err := Place(nil, Request{}); !errors.Is(err, ErrNoHost) {
		t.Errorf("no hosts: %v", err)
	}
	// Larger than every host in all is told apart from what waits for
	// room: 5 cores exceed both, 3 GiB of disk only big's free disk.
	if _, _, err := Place(hosts, Request{5000, gib, 0}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a request larger than every host: %v, want ErrTooLarge", err)
	}
	if _, _, err := Place(hosts, Request{1000, 4 * gib, 3 * gib}); err == nil || errors.Is(err, ErrTooLarge) {
		t.Errorf("a request that fits big once it frees disk: %v, want an error other than ErrTooLarge", err)
	}

	// A refusal names the resources no host has free, and none that some
	// host has.
	for _, c := range []struct {
		req  Request
		want []string
	}{
		{Request{3500, gib, 0}, []string{"CPU"}},                              // small has 2000, big 3000 free
		{Request{3500, 7 * gib, 0}, []string{"CPU", "memory"}},                // and 2 and 6 GiB
		{Request{1000, 4 * gib, 3 * gib}, nil},                                // small lacks memory, big disk
		{Request{5000, 9 * gib, 11 * gib}, []string{"CPU", "memory", "disk"}}, // none fits at all
		{Request{5000, 7 * gib, 0}, []string{"CPU"}},                          // too large for its CPU alone: big holds 7 GiB once idle
	} {
		_, _, err := Place(hosts, c.req)
		var shortage *Shortage
		if !errors.As(err, &shortage) || !slices.Equal(shortage.Lacking, c.want) {
			t.Errorf("Place(%v) = %v, want a Shortage lacking %v", c.req, err, c.want)
		}
	}
}
