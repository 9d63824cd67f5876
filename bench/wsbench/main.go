// Command wsbench measures, against a running `kibotos up`, how long a
// workspace takes from CreateWorkspace to AVAILABLE (p50, p99 over -n
// workspaces) side by side with a bare `runc run` of the same rootfs, and
// how much host memory each idle workspace costs; then (firstoutput.go)
// CreateWorkspace to the first byte of `echo ready` in it, one after
// another and -concurrent at once, beside a bare `runc run` printing it.
//
//	go run ./bench/wsbench -addr 127.0.0.1:8870 -home /var/lib/kibotos -n 50 -first-output 50 -concurrent 20
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
)

func main() {
	addr, home := benchutil.DeploymentFlags()
	n := flag.Int("n", 50, "workspaces to create for create→AVAILABLE and idle density; 0 skips them")
	first := flag.Int("first-output", 50, "creates timed to the first output of `echo ready`, one after another; 0 skips them")
	concurrent := flag.Int("concurrent", 20, "creates at once timed to all first outputs; 0 skips them")
	benchutil.Main("wsbench", func() error {
		if *n > 0 {
			if err := run(*addr, *home, *n); err != nil {
				return err
			}
		}
		if *first > 0 {
			return firstOutput(context.Background(), *addr, *home, *first, *concurrent)
		}
		return nil
	})
}

func run(addr, home string, n int) error {
	w, err := benchutil.Connect(addr, home)
	if err != nil {
		return err
	}
	ctx := context.Background()

	before, err := memAvailable()
	if err != nil {
		return err
	}
	var latencies []time.Duration
	defer w.DeleteAll(ctx)
	for range n {
		start := time.Now()
		id, err := w.Create(ctx)
		if err != nil {
			return err
		}
		if err := w.Await(ctx, id, 2*time.Millisecond, benchutil.Available); err != nil {
			return err
		}
		latencies = append(latencies, time.Since(start))
	}
	time.Sleep(2 * time.Second) // let idle guests settle
	after, err := memAvailable()
	if err != nil {
		return err
	}
	charged := benchutil.CgroupSum(w.IDs, "memory", "memory.usage_in_bytes")

	rootfs, err := benchutil.BaseRootfs(home)
	if err != nil {
		return err
	}
	bare, err := benchutil.BareRunc(rootfs, n, "/bin/true")
	if err != nil {
		return err
	}
	benchutil.Report("kibotos create→AVAILABLE", latencies)
	benchutil.Report("bare runc run /bin/true", bare)
	fmt.Printf("idle density: %.2f MiB charged to each idle workspace's memory cgroup; host MemAvailable fell %.2f MiB per workspace (%d workspaces, %d → %d MiB)\n",
		float64(charged)/float64(n)/(1<<20), float64(int64(before)-int64(after))/float64(n)/(1<<20), n, before>>20, after>>20)
	return nil
}

func memAvailable() (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no MemAvailable")
}
