package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	"github.com/kibotos/kibotos/sdk"
)

// firstByte is an io.Writer that keeps the time of its first write and
// everything written.
type firstByte struct {
	mu  sync.Mutex
	at  time.Time
	out []byte
}

func (f *firstByte) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at.IsZero() && len(p) > 0 {
		f.at = time.Now()
	}
	f.out = append(f.out, p...)
	return len(p), nil
}

// createToFirstByte creates a workspace (the default template, 0.1 CPU, 128 MiB,
// a 64 MiB layer), runs `echo ready` in it as soon as it is AVAILABLE and
// returns the time from the CreateWorkspace call to the first byte of its
// output; pooled reports whether a warm pool entry serves it (home's
// record of bound executions), read before it is deleted.
func createToFirstByte(ctx context.Context, c *sdk.Client, home string) (d time.Duration, pooled bool, err error) {
	start := time.Now()
	w, err := c.CreateWorkspace(ctx, sdk.CreateOptions{CPUMillis: 100, MemoryBytes: 128 << 20, DiskBytes: 64 << 20})
	if err != nil {
		return 0, false, err
	}
	defer func() { err = errors.Join(err, c.DeleteWorkspace(context.WithoutCancel(ctx), w.ID())) }()
	var out firstByte
	if _, err := w.Exec(ctx, []string{"echo", "ready"}, sdk.ExecOptions{Stdout: &out}); err != nil || string(out.out) != "ready\n" {
		return 0, false, errors.Join(fmt.Errorf("echo ready printed %q", out.out), err)
	}
	_, err = os.Stat(filepath.Join(home, "layers", ".pool", "bound", w.ID()+"-1"))
	return out.at.Sub(start), err == nil, nil
}

// firstOutput prints create→first byte of `echo ready`, p50 and p99 over
// n creates one after another (each deleted before the next), beside a
// bare `runc run /bin/echo ready` of the same rootfs and the ratio; then
// of concurrent creates at once, the p99 of all first outputs beside the
// serial p50.
func firstOutput(ctx context.Context, addr, home string, n, concurrent int) error {
	token, err := benchutil.AdminToken(home)
	if err != nil {
		return err
	}
	c := sdk.New("http://"+addr, token)
	defer c.Close()
	var serial []time.Duration
	hits := 0
	for range n {
		d, pooled, err := createToFirstByte(ctx, c, home)
		if err != nil {
			return err
		}
		serial = append(serial, d)
		if pooled {
			hits++
		}
	}
	rootfs, err := benchutil.BaseRootfs(home)
	if err != nil {
		return err
	}
	bare, err := benchutil.BareRunc(rootfs, n, "/bin/echo", "ready")
	if err != nil {
		return err
	}
	p50, p99 := benchutil.Quantile(serial, 0.5), benchutil.Quantile(serial, 0.99)
	fmt.Printf("create→first byte of echo ready, n=%d one after another (%d from the warm pool):\n", n, hits)
	fmt.Printf("  p50 %6.1f ms  bare runc run p50 %6.1f ms  ratio %.2f\n", benchutil.Millis(p50), benchutil.Millis(benchutil.Quantile(bare, 0.5)), benchutil.Millis(p50)/benchutil.Millis(benchutil.Quantile(bare, 0.5)))
	fmt.Printf("  p99 %6.1f ms  bare runc run p99 %6.1f ms  ratio %.2f\n", benchutil.Millis(p99), benchutil.Millis(benchutil.Quantile(bare, 0.99)), benchutil.Millis(p99)/benchutil.Millis(benchutil.Quantile(bare, 0.99)))
	if concurrent == 0 {
		return nil
	}
	all := make([]time.Duration, concurrent)
	pooled := make([]bool, concurrent)
	errs := make([]error, concurrent)
	var wg sync.WaitGroup
	for i := range concurrent {
		wg.Go(func() { all[i], pooled[i], errs[i] = createToFirstByte(ctx, c, home) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	hits = 0
	for _, p := range pooled {
		if p {
			hits++
		}
	}
	fmt.Printf("%d concurrent creates → all first outputs (%d from the warm pool): p50 %.1f ms, p99 %.1f ms; ratio p99 / serial p50 %.2f\n",
		concurrent, hits, benchutil.Millis(benchutil.Quantile(all, 0.5)), benchutil.Millis(benchutil.Quantile(all, 0.99)), benchutil.Millis(benchutil.Quantile(all, 0.99))/benchutil.Millis(p50))
	return nil
}
