// Command probebench measures, against a running `kibotos up` (as root),
// what idle workspaces cost in CPU: it samples the CPU time of the
// deployment's process (the control plane and the host agent, which
// probes every guest every 2 s and reports every 5 s) over a window with
// no workspace, creates -n idle ones, samples the same window again, and
// reports the difference per idle workspace per minute. It also reports
// the CPU the guests themselves spent (their cgroups' cpuacct), which is
// mostly answering the probes. It deletes what it created.
//
//	go run ./bench/probebench -addr 127.0.0.1:8870 -home /var/lib/kibotos -pid $(pgrep -o -x kibotos) -n 50
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

func main() {
	addr, home := benchutil.DeploymentFlags()
	pid := flag.Int("pid", 0, "PID of the kibotos up process")
	n := flag.Int("n", 50, "idle workspaces")
	window := flag.Duration("window", time.Minute, "how long each sample lasts")
	benchutil.Main("probebench", func() error { return run(*addr, *home, *pid, *n, *window) })
}

func run(addr, home string, pid, n int, window time.Duration) error {
	if pid == 0 {
		return errors.New("-pid is required")
	}
	w, err := benchutil.Connect(addr, home)
	if err != nil {
		return err
	}
	ctx := context.Background()

	idle, err := sample(pid, window)
	if err != nil {
		return err
	}
	defer w.DeleteAll(ctx)
	for range n {
		if _, err := w.Create(ctx); err != nil {
			return err
		}
	}
	for _, id := range w.IDs {
		err := w.Await(ctx, id, 50*time.Millisecond, func(ws *ctrlv1.Workspace) bool {
			return benchutil.Available(ws) && ws.GuestObservation.GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING
		})
		if err != nil {
			return err
		}
	}
	time.Sleep(5 * time.Second) // let the starts' work settle
	guestsBefore := time.Duration(benchutil.CgroupSum(home, w.IDs, "cpuacct", "cpuacct.usage"))
	loaded, err := sample(pid, window)
	if err != nil {
		return err
	}
	guests := time.Duration(benchutil.CgroupSum(home, w.IDs, "cpuacct", "cpuacct.usage")) - guestsBefore
	perMinute := func(d time.Duration) float64 {
		return float64(d) / float64(time.Millisecond) * float64(time.Minute) / float64(window)
	}
	fmt.Printf("kibotos up CPU: %.0f ms/min with no workspace, %.0f ms/min with %d idle workspaces\n", perMinute(idle), perMinute(loaded), n)
	fmt.Printf("per idle workspace: %.2f ms of kibotos up CPU per minute (ctrl + host agent), %.2f ms of its guest's CPU per minute\n",
		perMinute(loaded-idle)/float64(n), perMinute(guests)/float64(n))
	return nil
}

// sample returns the CPU time (user + system) the process spends over
// window.
func sample(pid int, window time.Duration) (time.Duration, error) {
	before, err := benchutil.ProcessCPU(pid)
	if err != nil {
		return 0, err
	}
	time.Sleep(window)
	after, err := benchutil.ProcessCPU(pid)
	return after - before, err
}
