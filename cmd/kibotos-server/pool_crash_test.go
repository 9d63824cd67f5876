package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestCrashWarmPool kills `kibotos up` with SIGKILL while its warm pool
// is full and a create is binding one of its entries, starts it again,
// and checks that the created workspace is served (by the entry it was
// bound to, or built anew) and that nothing is left of the entries no
// workspace was bound to: no container, runtime state, mount, loop
// device, cgroup, network namespace or layer image.
func TestCrashWarmPool(t *testing.T) {
	var entries []string // the full pool's entries before the kill
	var created string   // the workspace created as the kill came
	runCrashTable(t, []crashPoint{{
		name:   "full warm pool",
		delays: []time.Duration{0, 50 * time.Millisecond, 300 * time.Millisecond},
		seed:   func(*deployment) *seeded { return &seeded{} },
		begin: func(d *deployment, s *seeded) {
			// A fresh start (built, or bound after a restart) makes the
			// pool fill with its shape.
			d.createWorkspace(false)
			entries = d.awaitPoolEntries(2)
			created = d.createWorkspaceAsync()
		},
		recovered: func(d *deployment, s *seeded) {
			d.awaitWorkspace(created, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
			if got := strings.TrimSpace(d.cli("ws", "exec", created, "--", "hostname")); got != created {
				d.t.Errorf("the created workspace's hostname is %q", got)
			}
			serving, _ := os.ReadFile(filepath.Join(d.home, "layers", ".pool", "bound", created+"-1"))
			for _, rid := range entries {
				if rid != string(serving) {
					d.checkEntryGone(rid)
				}
			}
		},
	}})
}

// awaitPoolEntries waits until the warm pool has n entries whose guest
// answers, not bound to a workspace, and returns their runtime IDs.
func (d *deployment) awaitPoolEntries(n int) []string {
	d.t.Helper()
	drv := d.driver()
	deadline := time.Now().Add(convergeWithin)
	for {
		bound := map[string]bool{}
		aliases, _ := filepath.Glob(filepath.Join(d.home, "layers", ".pool", "bound", "*"))
		for _, a := range aliases {
			rid, _ := os.ReadFile(a)
			bound[string(rid)] = true
		}
		var ready []string
		for _, id := range d.containers() {
			if strings.HasPrefix(id, "pool-") && !bound[id] && drv.Probe(context.Background(), id) == nil {
				ready = append(ready, id)
			}
		}
		if len(ready) >= n {
			return ready
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("the warm pool has %d entries ready, want %d", len(ready), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkEntryGone checks that nothing is left of the warm pool entry rid.
func (d *deployment) checkEntryGone(rid string) {
	d.t.Helper()
	if slices.Contains(d.containers(), rid) {
		d.t.Errorf("the container of entry %s is left", rid)
	}
	for _, p := range []string{
		filepath.Join(d.home, "runtime", "exec", rid),
		filepath.Join(d.home, "netns", rid),
		filepath.Join(d.home, "layers", ".pool", "images", rid+".ext4"),
	} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			d.t.Errorf("%s of entry %s is left: %v", p, rid, err)
		}
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/kibotos/" + rid)
	if root, _ := filepath.Glob("/sys/fs/cgroup/kibotos/" + rid); len(root) > 0 {
		cgroups = append(cgroups, root...)
	}
	if len(cgroups) > 0 {
		d.t.Errorf("cgroups of entry %s are left: %v", rid, cgroups)
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mounts), rid) {
		d.t.Errorf("mounts of entry %s are left", rid)
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if b, _ := os.ReadFile(l); strings.Contains(string(b), rid) {
			d.t.Errorf("loop device of entry %s is left: %s on %s", rid, l, b)
		}
	}
}
