// Package hostpaths keeps a host's paths out of the messages that reach
// the API: a workspace's, Volume's or Transfer's failure, which its
// tenant reads, would otherwise say where and how the host keeps what
// (its home, mounts, cgroups and loop devices).
package hostpaths

import (
	"regexp"
	"sort"
	"strings"
)

// loopDevice matches the host's loop device names.
var loopDevice = regexp.MustCompile(`/dev/loop[0-9]+`)

// cgroupRoot is where the host's cgroups are.
const cgroupRoot = "/sys/fs/cgroup"

// Replace returns msg with each path of names (path → what it is, such as
// "<layer image>") replaced by what it is, a path inside another as
// itself, and the host's cgroup paths and loop devices by their kind.
func Replace(msg string, names map[string]string) string {
	paths := make([]string, 0, len(names)+1)
	for p := range names {
		if p != "" {
			paths = append(paths, p)
		}
	}
	if _, ok := names[cgroupRoot]; !ok {
		paths = append(paths, cgroupRoot)
	}
	// Longest first: a path inside another is replaced as itself.
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, p := range paths {
		name, ok := names[p]
		if !ok {
			name = "<cgroups>"
		}
		msg = strings.ReplaceAll(msg, p, name)
	}
	return loopDevice.ReplaceAllString(msg, "<loop device>")
}
