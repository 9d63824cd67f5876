package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	"github.com/kibotos/kibotos/sdk"
)

// idleCommand prints the round trip of a short command (a shell loop of
// iters steps, about iters µs of CPU) run after the workspace idled, in a
// workspace of 0.1 CPU beside ws (the default CPU): a command that needs
// more than the CFS quota of one period waits for the next periods unless
// the quota left unused while idle may be spent (the CPU burst).
func idleCommand(ctx context.Context, client *sdk.Client, ws *sdk.Workspace, iters, runs int) error {
	small, err := client.CreateWorkspace(ctx, sdk.CreateOptions{CPUMillis: 100})
	if err != nil {
		return err
	}
	defer client.DeleteWorkspace(ctx, small.ID())
	script := fmt.Sprintf("i=0; while [ $i -lt %d ]; do i=$((i+1)); done", iters)
	tenth, err := timeAfterIdle(ctx, small, script, runs)
	if err != nil {
		return err
	}
	full, err := timeAfterIdle(ctx, ws, script, runs)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("%d-step loop after idling, 0.1 CPU", iters)
	row(name+" p50 (ms)", benchutil.Millis(benchutil.Quantile(tenth, 0.5)), benchutil.Millis(benchutil.Quantile(full, 0.5)), "ms")
	row(name+" p99 (ms)", benchutil.Millis(benchutil.Quantile(tenth, 0.99)), benchutil.Millis(benchutil.Quantile(full, 0.99)), "ms")
	return nil
}

// timeAfterIdle times runs of `sh -c script` in ws, each after ws idled
// for three CFS periods (its session issued by a first run).
func timeAfterIdle(ctx context.Context, ws *sdk.Workspace, script string, runs int) ([]time.Duration, error) {
	var d []time.Duration
	for i := -1; i < runs; i++ {
		time.Sleep(300 * time.Millisecond)
		start := time.Now()
		st, err := ws.Exec(ctx, []string{"sh", "-c", script}, sdk.ExecOptions{})
		if err != nil || !st.Success() {
			return nil, fmt.Errorf("exec sh -c %q: %v %v", script, st, err)
		}
		if i >= 0 {
			d = append(d, time.Since(start))
		}
	}
	return d, nil
}
