package netslot

// A SocketBudget bounds the host sockets that the slots sharing it hold
// at once for their guests: one per TCP connection carried and per DNS
// query waiting for its upstream. Each is a file descriptor of the host
// agent's process, which its listeners, store and guests need too; a
// slot's own bounds (Config.MaxFlows, maxDNSExchanges) keep one guest
// from taking all of a budget, the budget keeps many from taking all of
// the process's. A nil budget bounds nothing.
type SocketBudget struct {
	tokens chan struct{}
}

// NewSocketBudget returns a budget of n sockets.
func NewSocketBudget(n int) *SocketBudget {
	return &SocketBudget{tokens: make(chan struct{}, n)}
}

// take takes a socket of the budget, or returns false when none is left.
func (b *SocketBudget) take() bool {
	if b == nil {
		return true
	}
	select {
	case b.tokens <- struct{}{}:
		return true
	default:
		return false
	}
}

// give returns a socket taken.
func (b *SocketBudget) give() {
	if b != nil {
		<-b.tokens
	}
}

// take takes a token of the slot's bound and a socket of the budget, or
// neither and returns false.
func take(bound chan struct{}, budget *SocketBudget) bool {
	select {
	case bound <- struct{}{}:
	default:
		return false
	}
	if !budget.take() {
		<-bound
		return false
	}
	return true
}

// give returns what take took.
func give(bound chan struct{}, budget *SocketBudget) {
	budget.give()
	<-bound
}
