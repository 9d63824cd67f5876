// Package fdlimit tells what share of the process's file descriptors a
// part of it may hold: the listeners' connections, the network slots'
// host sockets. Each part is bounded apart, so that clients or guests that
// fill one leave the others the descriptors they need.
package fdlimit

import "golang.org/x/sys/unix"

// unlimited is the share of a process whose descriptors are not limited.
const unlimited = 1 << 20

// Share returns the soft RLIMIT_NOFILE divided by parts, and at least
// least.
func Share(parts, least int) int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return unlimited
	}
	return max(int(rl.Cur)/parts, least)
}
