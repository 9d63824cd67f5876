// Package callshare bounds the calls in flight of each caller of a
// listener (a project, a host token): over HTTP/1.1 each call holds a
// connection, and a caller that holds every connection the listener may
// hold, with long streams or with requests sent a byte at a time, would
// shut every other caller out.
package callshare

import "sync"

// Shares counts the calls in flight of each caller, up to a bound each.
type Shares struct {
	max int

	mu       sync.Mutex
	inFlight map[string]int
}

// New bounds each caller to max calls in flight.
func New(max int) *Shares {
	return &Shares{max: max, inFlight: map[string]int{}}
}

// Max is the bound of each caller.
func (s *Shares) Max() int { return s.max }

// Take counts a call of caller and returns the function that ends it, or
// false when caller already has Max calls in flight. A nil Shares bounds
// nothing.
func (s *Shares) Take(caller string) (release func(), ok bool) {
	if s == nil {
		return func() {}, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[caller] >= s.max {
		return nil, false
	}
	s.inFlight[caller]++
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.inFlight[caller]--; s.inFlight[caller] == 0 {
			delete(s.inFlight, caller)
		}
	}), true
}
