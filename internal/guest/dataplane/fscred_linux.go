package dataplane

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// asUser runs fn with the filesystem credentials of u, so that the kernel
// checks every path fn touches as it would for u, and files fn creates
// belong to u (and to u's group, or the directory's when it is setgid).
//
// How: the goroutine locks its OS thread and sets that thread's
// supplementary groups, fsgid and fsuid. On Linux the three system calls
// act on the calling thread only (golang.org/x/sys/unix issues them raw,
// unlike package syscall's Setgroups, which changes every thread), and
// the Go runtime creates new threads from a clean template thread while a
// goroutine holds a thread locked, so no other goroutine ever runs with
// these credentials. A non-zero fsuid also drops the file capabilities
// (CAP_DAC_OVERRIDE, CAP_FOWNER, ...) from the thread's effective set;
// setting fsuid back to 0 restores them. If restoring fails, the thread
// stays locked, and the runtime destroys it when the goroutine ends.
//
// fn must stay on the calling goroutine: a goroutine it starts runs with
// the agent's credentials. Root (uid 0) runs fn directly; an agent that
// is not root can act only as its own user.
func asUser(u *User, fn func() error) error {
	euid := os.Geteuid()
	if int(u.UID) == euid {
		return fn()
	}
	if euid != 0 {
		return fmt.Errorf("acting as %s: %w", u.Name, syscall.EPERM)
	}
	runtime.LockOSThread()
	saved, err := unix.Getgroups()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	groups := make([]int, len(u.Groups))
	for i, g := range u.Groups {
		groups[i] = int(g)
	}
	if err := unix.Setgroups(groups); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setgroups for %s: %w", u.Name, err)
	}
	prevGID, _ := unix.SetfsgidRetGid(int(u.GID))
	prevUID, _ := unix.SetfsuidRetUid(int(u.UID))
	defer func() {
		unix.SetfsuidRetUid(prevUID)
		unix.SetfsgidRetGid(prevGID)
		errGroups := unix.Setgroups(saved)
		// setfsuid(-1) changes nothing and returns the current value.
		uid, _ := unix.SetfsuidRetUid(-1)
		gid, _ := unix.SetfsgidRetGid(-1)
		if errGroups == nil && uid == prevUID && gid == prevGID {
			runtime.UnlockOSThread()
		}
	}()
	uid, _ := unix.SetfsuidRetUid(-1)
	gid, _ := unix.SetfsgidRetGid(-1)
	if uid != int(u.UID) || gid != int(u.GID) {
		return fmt.Errorf("acting as %s: fsuid %d fsgid %d: %w", u.Name, uid, gid, syscall.EPERM)
	}
	return fn()
}
