package dataplane

import (
	"context"
	"sort"
	"sync"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// outKind says which stream output came from.
type outKind uint8

const (
	outStdout outKind = iota
	outStderr
	outPty
)

const (
	// maxChunk bounds one chunk of the log, and so one output event.
	maxChunk = 32 << 10
	// chunkOverhead is what the budget charges for each chunk besides its
	// bytes, so that many tiny writes cannot grow the log unboundedly.
	chunkOverhead = 64
	// minOutputLimit is the smallest budget a log accepts.
	minOutputLimit = 2 * (maxChunk + chunkOverhead)
)

// chunk is a run of output of one kind starting at the absolute offset
// off. Its bytes are never modified once written: readers get sub-slices
// and may hold them after the chunk left the log.
type chunk struct {
	kind outKind
	off  int64
	data []byte
}

// cursor is the position of one reader of a log, an absolute offset.
type cursor struct {
	pos int64
}

// outLog is the recent output of one process: a bounded, ordered log of
// chunks with absolute byte offsets, which any number of readers follow.
//
// While a reader is attached, a writer waits rather than drop bytes that
// reader has not read yet, so an attached stream sees every byte (the
// process blocks on a full pipe, as on a slow terminal). Without readers
// the oldest output is dropped to make room: a later reader replays only
// the most recent limit bytes. Once lossy is set (the process ended and
// its record is trimmed), writers never wait and lagging readers skip
// what was dropped.
type outLog struct {
	mu      sync.Mutex
	limit   int
	used    int     // sum of cap(data) + chunkOverhead over chunks
	chunks  []chunk // in offset order
	start   int64   // offset of the first byte still held
	end     int64   // offset after the last byte written
	readers map[*cursor]struct{}
	lossy   bool
	waiting int // writers waiting for room
	exit    *datav1.ProcessEvent_Exited
	changed chan struct{} // closed and replaced on every change
}

func newOutLog(limit int) *outLog {
	return &outLog{
		limit:   max(limit, minOutputLimit),
		readers: make(map[*cursor]struct{}),
		changed: make(chan struct{}),
	}
}

// broadcast wakes every waiter; l.mu must be held.
func (l *outLog) broadcast() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// write appends p (copied) as output of kind, waiting while attached
// readers still need the bytes that would have to go.
func (l *outLog) write(kind outKind, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(p) > 0 {
		n := min(len(p), maxChunk)
		l.makeRoom(n + chunkOverhead)
		if k := len(l.chunks); k > 0 && l.chunks[k-1].kind == kind && len(l.chunks[k-1].data)+n <= maxChunk {
			last := &l.chunks[k-1]
			before := cap(last.data)
			last.data = append(last.data, p[:n]...)
			l.used += cap(last.data) - before
		} else {
			data := append([]byte(nil), p[:n]...)
			l.chunks = append(l.chunks, chunk{kind: kind, off: l.end, data: data})
			l.used += cap(data) + chunkOverhead
		}
		l.end += int64(n)
		p = p[n:]
		l.broadcast()
	}
}

// makeRoom drops the oldest chunks until need more bytes fit, waiting
// while a reader still needs the oldest chunk. l.mu must be held.
func (l *outLog) makeRoom(need int) {
	for l.used+need > l.limit && len(l.chunks) > 0 {
		if l.lossy || !l.needed(l.chunks[0]) {
			l.dropFirst()
			continue
		}
		ch := l.changed
		l.waiting++
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
		l.waiting--
	}
}

// needed reports whether an attached reader has not read all of c.
func (l *outLog) needed(c chunk) bool {
	end := c.off + int64(len(c.data))
	for r := range l.readers {
		if r.pos < end {
			return true
		}
	}
	return false
}

func (l *outLog) dropFirst() {
	c := l.chunks[0]
	l.used -= cap(c.data) + chunkOverhead
	l.start = c.off + int64(len(c.data))
	l.chunks[0] = chunk{}
	l.chunks = l.chunks[1:]
	if len(l.chunks) == 0 {
		l.chunks = nil
	}
}

// writerWaiting reports whether a writer waits for readers to make room.
func (l *outLog) writerWaiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting > 0
}

// attach adds a reader positioned at the oldest byte still held.
func (l *outLog) attach() *cursor {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := &cursor{pos: l.start}
	l.readers[c] = struct{}{}
	return c
}

// detach removes a reader; writers waiting for it go on.
func (l *outLog) detach(c *cursor) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.readers, c)
	l.broadcast()
}

// next returns the reader's next output (kind and bytes, which the caller
// must not modify), or, once all output is read and the process ended,
// its exit. It blocks until one is there or ctx ends.
func (l *outLog) next(ctx context.Context, c *cursor) (outKind, []byte, *datav1.ProcessEvent_Exited, error) {
	for {
		l.mu.Lock()
		if c.pos < l.start {
			c.pos = l.start // dropped while lossy
		}
		if c.pos < l.end {
			i := sort.Search(len(l.chunks), func(i int) bool {
				return l.chunks[i].off+int64(len(l.chunks[i].data)) > c.pos
			})
			ch := l.chunks[i]
			from := c.pos - ch.off
			data := ch.data[from:len(ch.data):len(ch.data)]
			c.pos += int64(len(data))
			l.broadcast()
			l.mu.Unlock()
			return ch.kind, data, nil, nil
		}
		if l.exit != nil {
			exit := l.exit
			l.mu.Unlock()
			return 0, nil, exit, nil
		}
		wait := l.changed
		l.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return 0, nil, nil, ctx.Err()
		}
	}
}

// close records the exit, the last event every reader gets.
func (l *outLog) close(exit *datav1.ProcessEvent_Exited) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exit = exit
	l.broadcast()
}

// setLossy stops writers from waiting for readers.
func (l *outLog) setLossy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lossy = true
	l.broadcast()
}

// size returns how many bytes of memory the log holds.
func (l *outLog) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}

// discard drops the held output that no attached reader still needs: a
// later reader gets what is left and the exit. What an attached reader
// (an exec still streaming it) has not read stays: dropping it cut that
// reader's output short, silently, under the exit code.
func (l *outLog) discard() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.chunks) > 0 && !l.needed(l.chunks[0]) {
		l.dropFirst()
	}
	if len(l.chunks) == 0 {
		l.start = l.end
	}
	l.broadcast()
}
