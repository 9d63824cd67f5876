// Package netnsfile runs code inside network namespaces that are kept alive
// by a bind mount on a file, the way `ip netns` keeps them. Sockets and TUN
// devices keep the namespace they were made in, so what fn opens there
// works from any goroutine afterwards.
package netnsfile

import (
	"errors"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Create makes a new network namespace bound at path (an existing empty
// file) and runs fn in it.
func Create(path string, fn func() error) error { return run(path, true, fn) }

// Do runs fn in the namespace bound at path.
func Do(path string, fn func() error) error { return run(path, false, fn) }

// run runs fn on a thread in the namespace, then returns the thread to the
// namespace it came from. A thread that cannot return is never reused: it
// ends with its goroutine.
func run(path string, create bool, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		defer home.Close()
		if create {
			if err = unix.Unshare(unix.CLONE_NEWNET); err == nil {
				err = unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
			}
		} else {
			var target netns.NsHandle
			if target, err = netns.GetFromPath(path); err == nil {
				err = netns.Set(target)
				target.Close()
			}
		}
		if err == nil {
			err = fn()
		}
		if restore := netns.Set(home); restore != nil {
			done <- errors.Join(err, restore)
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}
