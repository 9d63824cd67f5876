package serviceconn

import (
	"sync"
	"time"
)

// deadline is a settable point in time that waiters select on, as in
// net.Pipe: its channel is closed once the time has passed.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	passed chan struct{}
}

func newDeadline() deadline { return deadline{passed: make(chan struct{})} }

// set moves the deadline to t; zero removes it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.passed // the timer fired: wait until it closed the channel
	}
	d.timer = nil
	closed := isDone(d.passed)
	if t.IsZero() {
		if closed {
			d.passed = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.passed = make(chan struct{})
		}
		passed := d.passed
		d.timer = time.AfterFunc(dur, func() { close(passed) })
		return
	}
	if !closed {
		close(d.passed)
	}
}

// wait returns a channel closed once the deadline has passed.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.passed
}

// expired reports whether the deadline has passed.
func (d *deadline) expired() bool { return isDone(d.wait()) }

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
