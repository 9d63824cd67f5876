// Package scheduler places workspaces on hosts: pure functions over each
// host's capacity and what is already reserved on it.
package scheduler

import (
	"errors"
	"fmt"
)

// Resources is an amount of each resource placement reserves.
type Resources struct {
	CPUMillis   uint32
	MemoryBytes uint64
	LayerBytes  uint64
}

// Host is one candidate host.
type Host struct {
	ID       string
	Capacity Resources
	Reserved Resources
	// DefaultLayerBytes is the host storage profile's writable layer size,
	// used when a request asks for none.
	DefaultLayerBytes uint64
}

// Request is what one workspace asks for; LayerBytes 0 takes the host's
// default.
type Request = Resources

// ErrNoHost is returned when no host is registered.
var ErrNoHost = errors.New("no host is registered with this deployment")

// ErrTooLarge is returned, wrapped, when the request exceeds what every
// host offers in all, reserved or not: no wait makes it fit.
var ErrTooLarge = errors.New("the request exceeds the capacity of every host")

// Shortage is the error of a request no host has room for: Lacking names
// the resources ("CPU", "memory", "disk", in that order) that no host has
// enough of free, or, for a request larger than every host (ErrTooLarge),
// that no host has enough of at all; empty when each host lacks some but
// none lacks them all. Its text names the hosts; Lacking names none.
type Shortage struct {
	Lacking []string
	hosts   []string // each host and what it lacks
}

func (e *Shortage) Error() string { return fmt.Sprintf("%v", e.hosts) }

// Exceeds reports whether req is more than capacity offers at all in any
// resource: no wait makes it fit.
func Exceeds(req, capacity Resources) bool {
	return req.CPUMillis > capacity.CPUMillis || req.MemoryBytes > capacity.MemoryBytes || req.LayerBytes > capacity.LayerBytes
}

// Place returns the host with room for req that has the most memory left,
// and the writable layer capacity it will give (req's, or the host's
// default). Ties go to the first host.
func Place(hosts []Host, req Request) (string, uint64, error) {
	if len(hosts) == 0 {
		return "", 0, ErrNoHost
	}
	best, bestFree, bestLayer := "", uint64(0), uint64(0)
	var short []string
	lackedBy := map[string]int{}   // a resource, and the hosts that lack it free
	exceededBy := map[string]int{} // a resource, and the hosts that lack it at all
	tooLarge := true
	for _, h := range hosts {
		layer := req.LayerBytes
		if layer == 0 {
			layer = h.DefaultLayerBytes
		}
		free := func(capacity, reserved uint64) uint64 {
			if reserved > capacity {
				return 0
			}
			return capacity - reserved
		}
		var missing []string
		if uint64(req.CPUMillis) > free(uint64(h.Capacity.CPUMillis), uint64(h.Reserved.CPUMillis)) {
			missing = append(missing, resourceNames[0])
		}
		memFree := free(h.Capacity.MemoryBytes, h.Reserved.MemoryBytes)
		if req.MemoryBytes > memFree {
			missing = append(missing, resourceNames[1])
		}
		if layer > free(h.Capacity.LayerBytes, h.Reserved.LayerBytes) {
			missing = append(missing, resourceNames[2])
		}
		for _, r := range missing {
			lackedBy[r]++
		}
		if !Exceeds(Resources{CPUMillis: req.CPUMillis, MemoryBytes: req.MemoryBytes, LayerBytes: layer}, h.Capacity) {
			tooLarge = false
		}
		for i, over := range []bool{req.CPUMillis > h.Capacity.CPUMillis, req.MemoryBytes > h.Capacity.MemoryBytes, layer > h.Capacity.LayerBytes} {
			if over {
				exceededBy[resourceNames[i]]++
			}
		}
		if len(missing) > 0 {
			short = append(short, fmt.Sprintf("%s lacks %v", h.ID, missing))
			continue
		}
		if best == "" || memFree > bestFree {
			best, bestFree, bestLayer = h.ID, memFree, layer
		}
	}
	if best == "" {
		shortage := &Shortage{hosts: short}
		counts := lackedBy
		if tooLarge {
			counts = exceededBy
		}
		for _, r := range resourceNames {
			if counts[r] == len(hosts) {
				shortage.Lacking = append(shortage.Lacking, r)
			}
		}
		if tooLarge {
			return "", 0, fmt.Errorf("%w: %w", ErrTooLarge, shortage)
		}
		return "", 0, fmt.Errorf("no host has the capacity the request needs free: %w", shortage)
	}
	return best, bestLayer, nil
}

// resourceNames are the resources placement reserves, as refusals name
// them.
var resourceNames = [...]string{"CPU", "memory", "disk"}
