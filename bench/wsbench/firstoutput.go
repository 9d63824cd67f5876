package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
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

// steps are the clients of one create→first byte, as the SDK makes its
// calls, but timed one by one.
type steps struct {
	sdk        *sdk.Client
	workspaces *benchutil.Workspaces
	sessions   ctrlv1connect.SessionServiceClient
}

// phases are when each call of a create→first byte ended, counted from
// the CreateWorkspace call.
type phases struct {
	created, available, session, firstByte time.Duration
}

// createToFirstByte creates a workspace (the default template, 0.1 CPU, 128 MiB,
// a 64 MiB layer), waits for AVAILABLE on WatchWorkspace, issues a
// session and runs `echo ready` in it, as the SDK's CreateWorkspace and
// Exec do, and returns when each ended; pooled reports whether a warm
// pool entry serves it (home's record of bound executions), read before
// it is deleted.
func createToFirstByte(ctx context.Context, c steps, home string) (p phases, pooled bool, err error) {
	start := time.Now()
	id, err := c.workspaces.Create(ctx)
	if err != nil {
		return p, false, err
	}
	p.created = time.Since(start)
	defer func() { err = errors.Join(err, c.sdk.DeleteWorkspace(context.WithoutCancel(ctx), id)) }()
	if err := c.workspaces.Watch(ctx, id, benchutil.Available); err != nil {
		return p, false, err
	}
	p.available = time.Since(start)
	issued, err := c.sessions.IssueSession(ctx, connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: id}))
	if err != nil {
		return p, false, err
	}
	p.session = time.Since(start)
	w := c.sdk.WorkspaceWithSession(id, &sdk.Session{ID: issued.Msg.GetSessionId(), Token: issued.Msg.GetToken(), Endpoint: issued.Msg.GetEndpoint()})
	var out firstByte
	if _, err := w.Exec(ctx, []string{"echo", "ready"}, sdk.ExecOptions{Stdout: &out}); err != nil || string(out.out) != "ready\n" {
		return p, false, errors.Join(fmt.Errorf("echo ready printed %q", out.out), err)
	}
	p.firstByte = out.at.Sub(start)
	return p, len(benchutil.PoolEntries(home, id)) > 0, nil
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
	client := sdk.New("http://"+addr, token)
	defer client.Close()
	workspaces, err := benchutil.Connect(addr, home)
	if err != nil {
		return err
	}
	c := steps{sdk: client, workspaces: workspaces,
		sessions: ctrlv1connect.NewSessionServiceClient(http.DefaultClient, "http://"+addr, connect.WithInterceptors(bearer.Token(token)))}
	var serial []time.Duration
	var pooledPhases []phases
	hits := 0
	for range n {
		p, pooled, err := createToFirstByte(ctx, c, home)
		if err != nil {
			return err
		}
		serial = append(serial, p.firstByte)
		if pooled {
			hits++
			pooledPhases = append(pooledPhases, p)
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
	if len(pooledPhases) > 0 {
		step := func(f func(phases) time.Duration) float64 {
			var d []time.Duration
			for _, p := range pooledPhases {
				d = append(d, f(p))
			}
			return benchutil.Millis(benchutil.Quantile(d, 0.5))
		}
		fmt.Printf("  from the warm pool, p50 of each step: create answered %.1f ms, AVAILABLE seen +%.1f, session issued +%.1f, first byte +%.1f\n",
			step(func(p phases) time.Duration { return p.created }),
			step(func(p phases) time.Duration { return p.available - p.created }),
			step(func(p phases) time.Duration { return p.session - p.available }),
			step(func(p phases) time.Duration { return p.firstByte - p.session }))
	}
	if concurrent == 0 {
		return nil
	}
	all := make([]time.Duration, concurrent)
	pooled := make([]bool, concurrent)
	errs := make([]error, concurrent)
	var wg sync.WaitGroup
	for i := range concurrent {
		wg.Go(func() {
			var p phases
			p, pooled[i], errs[i] = createToFirstByte(ctx, c, home)
			all[i] = p.firstByte
		})
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
