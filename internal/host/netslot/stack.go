package netslot

// carryStackBytes is about the stack a goroutine carrying a connection
// reaches: dialing, the guest's handshake in gVisor and the copy loops.
const carryStackBytes = 8 << 10

// growStack grows the calling goroutine's stack to carry a connection in
// one copy, made while the stack is still shallow. A goroutine starts with
// a small stack, and growing it a doubling at a time from deep in the
// dial or the stack's handshake copies and re-walks every frame each time:
// about 6% of the slot's CPU per connection in profiles.
//
//go:noinline
func growStack() {
	var frame [carryStackBytes]byte
	keepFrame(frame[:])
}

// keepFrame keeps growStack's frame from being optimized away.
//
//go:noinline
func keepFrame([]byte) {}
