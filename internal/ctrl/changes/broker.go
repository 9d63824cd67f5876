// Package changes wakes the control plane's waiters (workspace watchers,
// host assignment streams, the transfers loop) when the store changed:
// services publish after every committed change that a watcher or a host
// must see. With several ctrl replicas a relay (package pgnotify) carries
// every Publish to the other replicas, whose brokers Wake.
package changes

import "sync"

// Broker wakes everyone waiting for a change. Waiters re-read what they
// watch when woken, so a missed or merged wake-up loses nothing; they also
// poll, which bounds how long a change a relay lost can go unseen.
type Broker struct {
	mu      sync.Mutex
	changed chan struct{}
	byID    map[string]chan struct{}
	forward func(id string)
}

// NewBroker returns a Broker of one process.
func NewBroker() *Broker {
	return NewForwarding(nil)
}

// NewForwarding returns a Broker that also hands every Publish to forward
// (which must not block), for the other replicas; nil forwards nothing.
func NewForwarding(forward func(id string)) *Broker {
	return &Broker{changed: make(chan struct{}), byID: map[string]chan struct{}{}, forward: forward}
}

// Changed returns a channel closed at the next Publish or Wake.
func (b *Broker) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// ChangedID returns a channel closed at the next Publish or Wake of id or
// of "".
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

// Publish wakes the waiters of any change and those of id, here and, with
// a forwarding Broker, on every other replica; an empty id, for a change
// that may touch anything, wakes every waiter.
func (b *Broker) Publish(id string) {
	b.Wake(id)
	if b.forward != nil {
		b.forward(id)
	}
}

// Wake is Publish in this process alone: a relay wakes with the changes
// other replicas published.
func (b *Broker) Wake(id string) {
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
