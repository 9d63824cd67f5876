// Package changes wakes the control plane's waiters (workspace watchers,
// host assignment streams) when the store changed: services publish after
// every committed change that a watcher or a host must see.
package changes

import "sync"

// Broker wakes everyone waiting for a change. Waiters re-read what they
// watch when woken, so a missed or merged wake-up loses nothing; with
// several ctrl replicas they also poll.
type Broker struct {
	mu      sync.Mutex
	changed chan struct{}
	byID    map[string]chan struct{}
}

// NewBroker returns a Broker.
func NewBroker() *Broker {
	return &Broker{changed: make(chan struct{}), byID: map[string]chan struct{}{}}
}

// Changed returns a channel closed at the next Publish.
func (b *Broker) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// ChangedID returns a channel closed at the next Publish of id or of "".
func (b *Broker) ChangedID(id string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, ok := b.byID[id]
	if !ok {
		ch = make(chan struct{})
		b.byID[id] = ch
	}
	return ch
}

// Publish wakes the waiters of any change and those of id; an empty id,
// for a change that may touch anything, wakes every waiter.
func (b *Broker) Publish(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.changed)
	b.changed = make(chan struct{})
	if id == "" {
		for _, ch := range b.byID {
			close(ch)
		}
		clear(b.byID)
		return
	}
	if ch, ok := b.byID[id]; ok {
		close(ch)
		delete(b.byID, id)
	}
}
