package dataplane

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// WatchDirectory implements FileService.WatchDirectory with inotify
// (fsnotify). Each change is one message, in the order the kernel
// reported it: a rename is RENAME of the old path then CREATE of the new
// one. Recursively, every subdirectory gets a watch, including those that
// appear later; the entries already inside a directory that appears are
// reported as CREATE too (so an entry made right then may be reported
// twice, never missed). Watches are added as the user, who must be
// allowed to read each directory; one the user may not read is skipped.
// The stream ends when the directory itself is removed or moved, and
// fails with resource_exhausted when the kernel dropped events (queue
// overflow) or is out of watches.
func (s *FileService) WatchDirectory(ctx context.Context, req *connect.Request[datav1.WatchDirectoryRequest], stream *connect.ServerStream[datav1.WatchDirectoryResponse]) error {
	u, root, err := s.resolve(req.Msg.GetUser(), req.Msg.GetPath(), stageWatchingDirectory)
	if err != nil {
		return err
	}
	notify, err := fsnotify.NewBufferedWatcher(1024)
	if err != nil {
		return toConnect(stageWatchingDirectory, err)
	}
	defer notify.Close()
	w := &watch{user: u, root: root, recursive: req.Msg.GetRecursive(), notify: notify,
		send: func(path string, t datav1.FileEventType) error {
			return stream.Send(&datav1.WatchDirectoryResponse{Path: apiText(path), Type: t})
		}}
	err = asUser(u, func() error { return checkDir(root) })
	if err == nil {
		err = w.addTree(root, false)
	}
	if err != nil {
		return toConnect(stageWatchingDirectory, err)
	}
	// The response headers go out now: once the caller has them, the
	// watch is in place.
	if err := stream.Send(nil); err != nil {
		return toConnect(stageWatchingDirectory, err)
	}

	for {
		select {
		case <-ctx.Done():
			return toConnect(stageWatchingDirectory, ctx.Err())
		case <-s.closed:
			// The guest stops: the caller learns the watch ended short,
			// as a deleted workspace's caller does.
			return newError(connect.CodeUnavailable, stageWatchingDirectory, "the workspace is stopping: the watch ends with its guest")
		case err := <-notify.Errors:
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				return newError(connect.CodeResourceExhausted, stageWatchingDirectory, "events were lost: %v", err)
			}
			return toConnect(stageWatchingDirectory, err)
		case ev, ok := <-notify.Events:
			if !ok {
				return nil
			}
			if end, err := w.handle(ev); end || err != nil {
				return toConnect(stageWatchingDirectory, err)
			}
		}
	}
}

// checkDir checks that root is a directory.
func checkDir(root string) error {
	fi, err := os.Stat(root)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &os.PathError{Op: "watch", Path: root, Err: syscall.ENOTDIR}
	}
	return nil
}

// watch is one WatchDirectory stream's inotify watches.
type watch struct {
	user      *User
	root      string
	recursive bool
	notify    *fsnotify.Watcher
	send      func(path string, t datav1.FileEventType) error
}

// eventTypes maps fsnotify's operations to the events they are sent as,
// in the order an event with several is sent.
var eventTypes = []struct {
	op fsnotify.Op
	t  datav1.FileEventType
}{
	{fsnotify.Create, datav1.FileEventType_FILE_EVENT_TYPE_CREATE},
	{fsnotify.Write, datav1.FileEventType_FILE_EVENT_TYPE_WRITE},
	{fsnotify.Remove, datav1.FileEventType_FILE_EVENT_TYPE_REMOVE},
	{fsnotify.Rename, datav1.FileEventType_FILE_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, datav1.FileEventType_FILE_EVENT_TYPE_CHMOD},
}

// unnamedWrite reports whether ev is a write or a mode change of an
// unnamed file (isUnnamed), all an O_TMPFILE of a write gets: its link
// into place is a CREATE under its own name. A user's file named
// #<digits> that is gone by the time its event is read still has its
// CREATE, REMOVE and RENAME sent.
func unnamedWrite(ev fsnotify.Event) bool {
	return !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) && isUnnamed(ev.Name)
}

// handle sends ev and, recursively, watches a directory it created;
// events of the temporary files of WriteFile and the file bytes path,
// named or unnamed, are passed over (the file appears by a rename:
// CREATE). end reports that the watched directory itself was removed or
// moved.
func (w *watch) handle(ev fsnotify.Event) (end bool, err error) {
	if isTemp(ev.Name) || unnamedWrite(ev) {
		return false, nil // a write's own file: its rename is the news
	}
	for _, et := range eventTypes {
		if ev.Has(et.op) {
			if err := w.send(ev.Name, et.t); err != nil {
				return false, err
			}
		}
	}
	if ev.Name == w.root && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) {
		return true, nil
	}
	if !w.recursive || !ev.Has(fsnotify.Create) {
		return false, nil
	}
	var isDir bool
	asUser(w.user, func() error {
		fi, err := os.Lstat(ev.Name)
		isDir = err == nil && fi.IsDir()
		return nil
	})
	if isDir {
		if err := w.addTree(ev.Name, true); !skippable(err) {
			return false, err
		}
	}
	return false, nil
}

// skippable reports whether err is nil or says that a directory is
// unreadable or gone meanwhile, which a watch passes over.
func skippable(err error) bool {
	return err == nil || errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist)
}

// addTree watches dir and, recursively, its subdirectories; with report
// it sends CREATE for every entry it finds below dir.
func (w *watch) addTree(dir string, report bool) error {
	var subdirs, found []string
	err := asUser(w.user, func() error {
		if err := w.notify.Add(dir); err != nil {
			return err
		}
		if !w.recursive {
			return nil
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			found = append(found, p)
			if e.IsDir() {
				subdirs = append(subdirs, p)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range found {
		if report {
			if err := w.send(p, datav1.FileEventType_FILE_EVENT_TYPE_CREATE); err != nil {
				return err
			}
		}
		if slices.Contains(subdirs, p) {
			if err := w.addTree(p, report); !skippable(err) {
				return err
			}
		}
	}
	return nil
}
