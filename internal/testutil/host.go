package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// AssertNothingLeft checks the host for anything of a workspace that `kibotos
// up` ran under home: runc containers, mounts, loop devices, cgroups and
// files.
func AssertNothingLeft(t testing.TB, home, workspaceID string) {
	t.Helper()
	var leftovers []string
	out, _ := exec.Command("runc", "--root", filepath.Join(home, "runtime", "runc"), "list", "-q").Output()
	if strings.Contains(string(out), workspaceID) {
		leftovers = append(leftovers, "runc container: "+string(out))
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mounts), "\n") {
			if strings.Contains(line, workspaceID) {
				leftovers = append(leftovers, "mount: "+line)
			}
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if b, _ := os.ReadFile(l); strings.Contains(string(b), workspaceID) {
			leftovers = append(leftovers, "loop device: "+l)
		}
	}
	if cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/kibotos/" + workspaceID + "*"); len(cgroups) > 0 {
		leftovers = append(leftovers, fmt.Sprint("cgroups: ", cgroups))
	}
	filepath.Walk(home, func(path string, info os.FileInfo, err error) error {
		if err == nil && strings.Contains(filepath.Base(path), workspaceID) {
			leftovers = append(leftovers, "file: "+path)
		}
		return nil
	})
	for _, l := range leftovers {
		t.Error("left behind: " + l)
	}
}
