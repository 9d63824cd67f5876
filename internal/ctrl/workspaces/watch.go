package workspaces

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
)

// watches shares one reader per watched workspace among all its
// watchers, so that a change costs one store read however many watch.
type watches struct {
	mu    sync.Mutex
	feeds map[watchKey]*feed
}

type watchKey struct{ projectID, id string }

// feed is what its watchers see of one workspace: its reader stores each
// new version (or the error that ended the feed) and wakes them.
type feed struct {
	stop     context.CancelFunc
	watchers int // under watches.mu

	mu   sync.Mutex
	ws   *ctrlv1.Workspace
	err  error
	next chan struct{} // closed when ws or err changes
}

// Watch calls send with the workspace now and after every change, until
// ctx ends, send fails, or the workspace is DELETED. poll bounds how long
// a change made by another ctrl replica can go unseen.
//
// The first version sent is read for this watcher: a feed it joins may
// not have read a change committed just before (a caller that stops a
// workspace and then watches it must see it STOPPING, not AVAILABLE);
// versions of the feed older than what was sent are skipped.
func (s *Service) Watch(ctx context.Context, id string, poll time.Duration, send func(*ctrlv1.Workspace) error) error {
	key := watchKey{caller(ctx).ProjectID, id}
	f := s.join(ctx, key, poll)
	defer s.leave(key, f)
	sent, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	if err := send(sent); err != nil || sent.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return err
	}
	var last *ctrlv1.Workspace // of the feed
	for {
		f.mu.Lock()
		ws, err, next := f.ws, f.err, f.next
		f.mu.Unlock()
		if err != nil {
			return err
		}
		if ws != nil && ws != last {
			last = ws
			if !ws.UpdatedAt.AsTime().Before(sent.UpdatedAt.AsTime()) && !proto.Equal(ws, sent) {
				if err := send(ws); err != nil {
					return err
				}
				sent = ws
				if ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-next:
		}
	}
}

// join returns the feed of key, starting its reader for the first
// watcher. The reader reads as the watcher's project.
func (s *Service) join(ctx context.Context, key watchKey, poll time.Duration) *feed {
	w := &s.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	if f, ok := w.feeds[key]; ok {
		f.watchers++
		return f
	}
	if w.feeds == nil {
		w.feeds = map[watchKey]*feed{}
	}
	readCtx, stop := context.WithCancel(auth.WithCaller(context.WithoutCancel(ctx), caller(ctx)))
	f := &feed{stop: stop, watchers: 1, next: make(chan struct{})}
	w.feeds[key] = f
	go s.read(readCtx, key, poll, f)
	return f
}

// leave stops the feed's reader with its last watcher.
func (s *Service) leave(key watchKey, f *feed) {
	w := &s.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	if f.watchers--; f.watchers == 0 {
		f.stop()
		if w.feeds[key] == f {
			delete(w.feeds, key)
		}
	}
}

// read reads the workspace after every change of it and every poll,
// until ctx ends, a read fails or the workspace is DELETED; a feed that
// ended is no longer joined.
func (s *Service) read(ctx context.Context, key watchKey, poll time.Duration, f *feed) {
	defer func() {
		s.watches.mu.Lock()
		if s.watches.feeds[key] == f {
			delete(s.watches.feeds, key)
		}
		s.watches.mu.Unlock()
	}()
	for {
		changed := s.Changes.ChangedID(key.id)
		ws, err := s.Get(ctx, key.id)
		if ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		if err != nil || f.ws == nil || !proto.Equal(f.ws, ws) {
			f.ws, f.err = ws, err
			close(f.next)
			f.next = make(chan struct{})
		}
		f.mu.Unlock()
		if err != nil || ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(poll):
		}
	}
}
