// Command wsbench measures, against a running `kibotos up`, how long a
// workspace takes from CreateWorkspace to AVAILABLE (p50, p99 over -n
// workspaces, -parallel at once) side by side with a bare `runc run` of the
// same rootfs, how much host memory each idle workspace costs and where it
// goes, and whether every one answers an exec; then (firstoutput.go)
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	"github.com/kibotos/kibotos/sdk"
)

func main() {
	addr, home := benchutil.DeploymentFlags()
	n := flag.Int("n", 50, "workspaces to create for create→AVAILABLE and idle density; 0 skips them")
	parallel := flag.Int("parallel", 1, "creates (and the execs that check the idle workspaces answer) in flight at once for -n; above 1 the create→AVAILABLE row measures a burst, not one create")
	serverPID := flag.Int("server-pid", 0, "the kibotos-server process of the deployment: its resident memory is reported before and after (0: not reported)")
	first := flag.Int("first-output", 50, "creates timed to the first output of `echo ready`, one after another; 0 skips them")
	settle := flag.Duration("settle", 500*time.Millisecond, "after each create of a second -first-output series, wait for DELETED and this long more, so that each create finds the host at rest; 0 skips the series")
	concurrent := flag.Int("concurrent", 20, "creates at once timed to all first outputs; 0 skips them")
	benchutil.Main("wsbench", func() error {
		if *n > 0 {
			if err := run(*addr, *home, *n, max(*parallel, 1), *serverPID); err != nil {
				return err
			}
		}
		if *first > 0 {
			return firstOutput(context.Background(), *addr, *home, *first, *settle, *concurrent)
		}
		return nil
	})
}

// bareRuns caps the bare `runc run`s timed beside -n creates: enough for
// a p99, and a thousand would only add minutes.
const bareRuns = 50

func run(addr, home string, n, parallel, serverPID int) error {
	w, err := benchutil.Connect(addr, home)
	if err != nil {
		return err
	}
	ctx := context.Background()

	before, err := meminfo()
	if err != nil {
		return err
	}
	rssBefore := residentMemory(serverPID)
	defer w.DeleteAll(ctx)
	latencies, failed := inParallel(n, parallel, "created", func(int) (time.Duration, error) {
		start := time.Now()
		id, err := w.Create(ctx)
		if err != nil {
			return 0, err
		}
		if err := w.Await(ctx, id, 2*time.Millisecond, benchutil.Available); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	})
	time.Sleep(2 * time.Second) // let idle guests settle
	after, err := meminfo()
	if err != nil {
		return err
	}
	rssAfter := residentMemory(serverPID)
	charged := benchutil.CgroupSum(home, w.IDs, "memory", "memory.usage_in_bytes")
	idle := len(latencies)
	if idle == 0 {
		return fmt.Errorf("no workspace became AVAILABLE: %w", failed)
	}
	name := "kibotos create→AVAILABLE"
	if parallel > 1 {
		name = fmt.Sprintf("kibotos create→AVAILABLE (%d at once)", parallel)
	}
	benchutil.Report(name, latencies)
	if failed != nil {
		fmt.Printf("  %d of %d creates failed; the first: %v\n", n-idle, n, failed)
	}
	perWorkspace := func(b, a uint64) float64 { return (float64(b) - float64(a)) / float64(idle) / (1 << 20) }
	fmt.Printf("idle density: %.2f MiB charged to each idle workspace's memory cgroup; host MemAvailable fell %.2f MiB per workspace (%d workspaces, %d → %d MiB)\n",
		float64(charged)/float64(idle)/(1<<20), perWorkspace(before["MemAvailable"], after["MemAvailable"]), idle, before["MemAvailable"]>>20, after["MemAvailable"]>>20)
	fmt.Printf("  per workspace, of the kernel's counts: slab %.2f MiB (unreclaimable %.2f), kernel stacks %.2f, page tables %.2f, anonymous %.2f, shmem %.2f MiB\n",
		perWorkspace(after["Slab"], before["Slab"]), perWorkspace(after["SUnreclaim"], before["SUnreclaim"]), perWorkspace(after["KernelStack"], before["KernelStack"]),
		perWorkspace(after["PageTables"], before["PageTables"]), perWorkspace(after["AnonPages"], before["AnonPages"]), perWorkspace(after["Shmem"], before["Shmem"]))
	if serverPID > 0 {
		fmt.Printf("  kibotos-server resident memory %d → %d MiB: %.2f MiB per workspace\n", rssBefore>>20, rssAfter>>20, perWorkspace(rssAfter, rssBefore))
	}
	token, err := benchutil.AdminToken(home)
	if err != nil {
		return err
	}
	c := sdk.New("http://"+addr, token)
	defer c.Close()
	execs, failed := execEach(ctx, c, w.IDs, parallel)
	benchutil.Report(fmt.Sprintf("exec true in each of the %d idle", len(w.IDs)), execs)
	if failed != nil {
		fmt.Printf("  %d of %d did not answer; the first: %v\n", len(w.IDs)-len(execs), len(w.IDs), failed)
	}

	rootfs, err := benchutil.BaseRootfs(home)
	if err != nil {
		return err
	}
	bare, err := benchutil.BareRunc(rootfs, min(n, bareRuns), "/bin/true")
	if err != nil {
		return err
	}
	benchutil.Report("bare runc run /bin/true", bare)
	return nil
}

// inParallel runs do(i) for i in [0, n), parallel at a time, and returns
// the durations of those that succeeded and the first error of those that
// did not. what names the work in the progress line printed to stderr
// every tenth of n.
func inParallel(n, parallel int, what string, do func(int) (time.Duration, error)) ([]time.Duration, error) {
	var (
		mu    sync.Mutex
		out   []time.Duration
		first error
		wg    sync.WaitGroup
		done  atomic.Int64
	)
	slots := make(chan struct{}, parallel)
	for i := range n {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			d, err := do(i)
			mu.Lock()
			if err == nil {
				out = append(out, d)
			} else if first == nil {
				first = err
			}
			mu.Unlock()
			if k := done.Add(1); n >= 100 && k%int64(n/10) == 0 {
				fmt.Fprintf(os.Stderr, "wsbench: %d of %d %s\n", k, n, what)
			}
		})
	}
	wg.Wait()
	return out, first
}

// execEach runs `true` in each workspace through the SDK, parallel at a
// time, and returns each round trip that succeeded (session included) and
// the first failure, naming its workspace.
func execEach(ctx context.Context, c *sdk.Client, ids []string, parallel int) ([]time.Duration, error) {
	return inParallel(len(ids), parallel, "answered exec", func(i int) (time.Duration, error) {
		start := time.Now()
		ws, err := c.Workspace(ctx, ids[i])
		if err == nil {
			_, err = ws.Exec(ctx, []string{"true"}, sdk.ExecOptions{})
		}
		if err != nil {
			return 0, fmt.Errorf("exec true in %s: %w", ids[i], err)
		}
		return time.Since(start), nil
	})
}

// residentMemory is the resident memory of process pid (VmRSS), or zero
// when pid is zero or cannot be read.
func residentMemory(pid int) uint64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	_, rest, _ := strings.Cut(string(b), "VmRSS:")
	line, _, _ := strings.Cut(rest, "\n")
	return kibibytes(line)
}

// meminfo reads /proc/meminfo: bytes by field name.
func meminfo() (map[string]uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	fields := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		if name, rest, ok := strings.Cut(line, ":"); ok {
			fields[name] = kibibytes(rest)
		}
	}
	if _, ok := fields["MemAvailable"]; !ok {
		return nil, fmt.Errorf("no MemAvailable in /proc/meminfo")
	}
	return fields, nil
}

// kibibytes reads the value " N kB" of a /proc line, in bytes.
func kibibytes(value string) uint64 {
	kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(value), "kB")), 10, 64)
	return kb << 10
}
