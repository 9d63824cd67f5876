package oci

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cpuBandwidth reads the CFS quota and burst of the execution's cgroup,
// in µs as cgroup v1 writes them ("-1" for no quota), or cgroup2's.
func cpuBandwidth(t *testing.T, id string) (quota, burst string) {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	dir, v1 := cpuCgroup(id)
	if v1 {
		return read(filepath.Join(dir, "cpu.cfs_quota_us")), read(filepath.Join(dir, "cpu.cfs_burst_us"))
	}
	quota, _, _ = strings.Cut(read(filepath.Join(dir, "cpu.max")), " ")
	if quota == "max" {
		quota = "-1"
	}
	return quota, read(filepath.Join(dir, "cpu.max.burst"))
}

// TestCPUBurst: a CPU limit comes with a burst of one period's quota,
// also when the quota falls below the burst before it, and goes with it;
// a guest that left its quota unused runs above it for a period, which
// the kernel counts as a burst.
func TestCPUBurst(t *testing.T) {
	e := newEnv(t)
	spec := e.spec("burst", e.image(t))
	spec.CPUMillis = 0
	e.start(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		millis       uint32
		quota, burst string
	}{{500, "50000", "50000"}, {100, "10000", "10000"}, {0, "-1", "0"}, {100, "10000", "10000"}} {
		if err := e.d.SetCPU(ctx, spec.ID, c.millis); err != nil {
			t.Fatalf("SetCPU(%d): %v", c.millis, err)
		}
		if quota, burst := cpuBandwidth(t, spec.ID); quota != c.quota || burst != c.burst {
			t.Errorf("after SetCPU(%d): quota %s µs, burst %s µs; want %s, %s", c.millis, quota, burst, c.quota, c.burst)
		}
	}
	// Idle for a few periods, then spin for about ten quotas of CPU.
	time.Sleep(3 * cfsPeriod * time.Microsecond)
	e.exec(t, spec.ID, "sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done")
	dir, _ := cpuCgroup(spec.ID)
	if n, ok := readKey(filepath.Join(dir, "cpu.stat"), "nr_bursts"); !ok || n == 0 {
		t.Errorf("the guest never ran above its quota after idling: %d bursts (read: %v)", n, ok)
	}
}
