package sdk

import (
	"context"
	"errors"
	"io"
)

// rereadBytes bounds what an upload holds of a reader that cannot seek
// back, to send it again with a new session; a refusal after more was
// read is the caller's.
const rereadBytes = 8 << 20

// errAttemptEnded fails the reads of an upload's attempt once the upload
// is sent again: the transport may go on reading a failed request's body.
var errAttemptEnded = errors.New("the upload is being sent again")

// rereader reads a stream once for the attempts of one upload (a first one
// refused for its session, then one with a new session): each attempt
// reads what the earlier ones read, held up to bound bytes, then the rest
// of the stream.
type rereader struct {
	src   io.Reader
	bound int
	turn  chan struct{} // one read of src at a time; holds the fields below
	held  []byte
	over  bool // more than bound was read: held is dropped
	// end is how src ended (io.EOF, or its failure), which stays its
	// own: a reader read again after either need not say so again.
	end error
	// attempt numbers the current attempt; an earlier one reads no more.
	attempt int
}

func newRereader(src io.Reader, bound int) *rereader {
	return &rereader{src: src, bound: bound, turn: make(chan struct{}, 1)}
}

// next starts an attempt, which reads the stream from its start.
func (r *rereader) next() io.Reader {
	r.turn <- struct{}{}
	defer func() { <-r.turn }()
	r.attempt++
	return &attemptReader{r: r, attempt: r.attempt}
}

// errNotHeld refuses a restart after more of the stream was read than is
// held.
var errNotHeld = errors.New("more of the upload was read than is held")

// restart ends the current attempt, waiting for its read in progress, and
// returns nil when a new attempt can read the stream from its start (all
// that was read is held), errNotHeld when it cannot, the stream's failure
// when it failed, and ctx's error when ctx ends first.
func (r *rereader) restart(ctx context.Context) error {
	select {
	case r.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.turn }()
	r.attempt++
	switch {
	case r.end != nil && r.end != io.EOF:
		return r.end
	case r.over:
		return errNotHeld
	}
	return nil
}

// attemptReader is one attempt's reading of a rereader's stream.
type attemptReader struct {
	r       *rereader
	attempt int
	at      int // the offset of its next byte in the stream
}

func (a *attemptReader) Read(p []byte) (int, error) {
	r := a.r
	r.turn <- struct{}{}
	defer func() { <-r.turn }()
	if a.attempt != r.attempt {
		return 0, errAttemptEnded
	}
	if a.at < len(r.held) {
		n := copy(p, r.held[a.at:])
		a.at += n
		return n, nil
	}
	if r.end != nil {
		return 0, r.end
	}
	n, err := r.src.Read(p)
	if err != nil {
		r.end = err
	}
	a.at += n
	if !r.over {
		if len(r.held)+n > r.bound {
			r.over, r.held = true, nil
		} else {
			r.held = append(r.held, p[:n]...)
		}
	}
	return n, err
}
