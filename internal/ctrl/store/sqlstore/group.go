package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// maxGroup bounds how many Updates share one transaction.
const maxGroup = 256

// errClosed answers an Update that arrives after Close.
var errClosed = errors.New("store is closed")

// committer is group commit for a backend with one writer: Updates that
// arrive while a transaction commits queue up, and the next transaction
// runs them all, each in its own savepoint, then commits once (one sync to
// disk for the lot). An Update whose fn fails rolls back to its savepoint
// and leaves the others of its group alone; every Update is answered only
// once the transaction holding it has committed.
type committer struct {
	s *Store

	mu     sync.Mutex
	queue  []*pending
	closed bool
	wake   chan struct{}
	done   chan struct{}
}

// pending is one Update waiting for its group.
type pending struct {
	ctx      context.Context
	fn       func(store.Tx) error
	err      error // fn's own error, or the group's
	panicked any
	answered chan struct{}
}

func newCommitter(s *Store) *committer {
	c := &committer{s: s, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go c.loop()
	return c
}

// update queues fn and waits for its group to commit.
func (c *committer) update(ctx context.Context, fn func(store.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := &pending{ctx: ctx, fn: fn, answered: make(chan struct{})}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errClosed
	}
	c.queue = append(c.queue, p)
	c.mu.Unlock()
	c.signal()
	// fn runs on the committer's goroutine and may write the caller's
	// variables until it is answered, so the caller waits even when ctx
	// ends: its fn is skipped if it has not started.
	<-p.answered
	if p.panicked != nil {
		panic(p.panicked)
	}
	return p.err
}

func (c *committer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// close runs what is queued and stops.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.signal()
	<-c.done
}

func (c *committer) loop() {
	defer close(c.done)
	for range c.wake {
		for {
			c.mu.Lock()
			n := min(len(c.queue), maxGroup)
			group := c.queue[:n:n]
			c.queue = c.queue[n:]
			closed := c.closed
			c.mu.Unlock()
			if n == 0 {
				if closed {
					return
				}
				break
			}
			c.commit(group)
		}
	}
}

// commit runs a group to completion and answers every member.
func (c *committer) commit(group []*pending) {
	var err error
	for attempt := range maxAttempts {
		var retry []*pending
		retry, err = c.try(group)
		if err == nil || !c.s.dialect.Retryable(err) {
			group = retry
			break
		}
		group = retry
		time.Sleep(time.Duration(attempt+1) * time.Millisecond)
	}
	for _, p := range group {
		p.err = fmt.Errorf("%s: %w", c.s.dialect.Name, err)
		close(p.answered)
	}
}

// try runs the group in one transaction. It answers the members it is
// done with (all of them once the transaction commits) and returns the
// others with the error that stopped the transaction.
func (c *committer) try(group []*pending) ([]*pending, error) {
	ctx := context.Background()
	sqlTx, err := c.s.write.BeginTx(ctx, &c.s.dialect.WriteTx)
	if err != nil {
		return group, err
	}
	t := &tx{tx: sqlTx, d: &c.s.dialect, detached: true}
	if c.s.cache != nil {
		t.touched = make(map[rowKey]struct{})
	}
	ran := make([]*pending, 0, len(group))
	for i, p := range group {
		if p.err = p.ctx.Err(); p.err != nil {
			ran = append(ran, p) // skipped: nothing of it to roll back
			continue
		}
		if _, err := sqlTx.ExecContext(ctx, "SAVEPOINT command"); err != nil {
			_ = sqlTx.Rollback()
			return group, err
		}
		p.err, p.panicked = call(p.fn, t)
		if p.err != nil || p.panicked != nil {
			if _, err := sqlTx.ExecContext(ctx, "ROLLBACK TO command"); err != nil {
				// The failure broke the whole transaction: answer this
				// member and run the others again without it.
				_ = sqlTx.Rollback()
				close(p.answered)
				c.commit(append(ran, group[i+1:]...))
				return nil, nil
			}
		}
		if _, err := sqlTx.ExecContext(ctx, "RELEASE command"); err != nil {
			_ = sqlTx.Rollback()
			return group, err
		}
		ran = append(ran, p)
	}
	// The cache drops what the group wrote before the commit, and keeps
	// nothing new until it is done, before any member is answered.
	if c.s.cache != nil {
		c.s.cache.beginCommit(t.touched)
	}
	err = sqlTx.Commit()
	if c.s.cache != nil {
		c.s.cache.endCommit()
	}
	if err != nil {
		return group, err
	}
	for _, p := range ran {
		close(p.answered)
	}
	return nil, nil
}

// call runs fn, turning a panic into a value to re-raise on the caller's
// goroutine.
func call(fn func(store.Tx) error, t *tx) (err error, panicked any) {
	defer func() {
		if r := recover(); r != nil {
			panicked = r
		}
	}()
	return fn(t), nil
}
