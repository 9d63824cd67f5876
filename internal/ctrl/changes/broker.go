// Package changes wakes the control plane's waiters (workspace watchers,
// host assignment streams) when the store changed: services publish after
// every committed change that a watcher or a host must see.
package changes

import "sync"

// Broker wakes everyone waiting for a change. Waiters re-read
// the store when woken, so a missed or merged wake-up loses nothing; with
// several ctrl replicas they also poll.
type Broker struct {
	mu      sync.Mutex
	changed chan struct{}
}

// NewBroker returns a Broker.
func NewBroker() *Broker { return &Broker{changed: make(chan struct{})} }

// Changed returns a channel closed at the next Publish.
func (b *Broker) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// Publish wakes every waiter. The ID is for future filtering; every
// waiter re-reads what it watches.
func (b *Broker) Publish(string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.changed)
	b.changed = make(chan struct{})
}
