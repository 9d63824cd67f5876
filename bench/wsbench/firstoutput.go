package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
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
// the CreateWorkspace call; nextExec is how long a second `echo ready`
// took to its first byte, timed at rest only.
type phases struct {
	created, available, session, firstByte time.Duration
	nextExec                               time.Duration
}

// createToFirstByte creates a workspace (the default template, 0.1 CPU, 128 MiB,
// a 64 MiB layer), waits for AVAILABLE on WatchWorkspace, issues a
// session and runs `echo ready` in it, as the SDK's CreateWorkspace and
// Exec do, and returns when each ended; pooled reports whether a warm
// pool entry serves it (home's record of bound executions), read before
// it is deleted. With settle above 0 it then times a second exec, which
// finds the guest agent warm, and returns once the workspace is DELETED
// and settle more has passed, leaving the host at rest: the deletion done
// and the warm pool refilled.
func createToFirstByte(ctx context.Context, c steps, home string, settle time.Duration) (p phases, pooled bool, err error) {
	start := time.Now()
	id, err := c.workspaces.Create(ctx)
	if err != nil {
		return p, false, err
	}
	p.created = time.Since(start)
	defer func() {
		ctx := context.WithoutCancel(ctx)
		err = errors.Join(err, c.sdk.DeleteWorkspace(ctx, id))
		if err == nil && settle > 0 {
			err = c.workspaces.Watch(ctx, id, func(ws *ctrlv1.Workspace) bool { return ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED })
			time.Sleep(settle)
		}
	}()
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
	if settle > 0 {
		var next firstByte
		start := time.Now()
		if _, err := w.Exec(ctx, []string{"echo", "ready"}, sdk.ExecOptions{Stdout: &next}); err != nil || string(next.out) != "ready\n" {
			return p, false, errors.Join(fmt.Errorf("the second echo ready printed %q", next.out), err)
		}
		p.nextExec = next.at.Sub(start)
	}
	return p, len(benchutil.PoolEntries(home, id)) > 0, nil
}

// firstOutput prints create→first byte of `echo ready`, p50 and p99 over
// n creates one after another (each deleted before the next), beside a
// bare `runc run /bin/echo ready` of the same rootfs and the ratio: back
// to back, and at rest (settle; 0 skips it), where a bare run comes right
// before each create; then of concurrent creates
// at once, the p99 of all first outputs beside the back-to-back p50.
func firstOutput(ctx context.Context, addr, home string, n int, settle time.Duration, concurrent int) error {
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
	backToBack, err := firstOutputSeries(ctx, c, home, n, 0, nil)
	if err != nil {
		return err
	}
	// The template's layer is unpacked once a workspace has used it.
	rootfs, err := benchutil.BaseRootfs(home)
	if err != nil {
		return err
	}
	bundle, err := benchutil.NewBareBundle(rootfs, "/bin/echo", "ready")
	if err != nil {
		return err
	}
	defer bundle.Close()
	var atRest series
	if settle > 0 {
		if atRest, err = firstOutputSeries(ctx, c, home, n, settle, bundle); err != nil {
			return err
		}
	}
	// At rest, each create was timed right after a bare run, on the host
	// as it was then: the ratio compares like with like on a machine
	// whose speed drifts. Without that series the bare runs follow.
	bare := atRest.bare
	for len(bare) < n {
		d, err := bundle.Run()
		if err != nil {
			return err
		}
		bare = append(bare, d)
	}
	fmt.Printf("create→first byte of echo ready, n=%d one after another, each deleted before the next:\n", n)
	backToBack.print("back to back", bare)
	if settle > 0 {
		atRest.print(fmt.Sprintf("at rest (after each deletion ended and %s more)", settle), bare)
	}
	p50 := benchutil.Quantile(backToBack.firstBytes, 0.5)
	if concurrent == 0 {
		return nil
	}
	burst, err := concurrentFirstOutputs(ctx, c, home, concurrent)
	if err != nil {
		return err
	}
	p99 := benchutil.Quantile(burst.firstBytes, 0.99)
	fmt.Printf("%d concurrent creates → all first outputs (%d from the warm pool): p50 %.1f ms, p99 %.1f ms; ratio p99 / back-to-back p50 %.2f\n",
		concurrent, len(burst.pooled), benchutil.Millis(benchutil.Quantile(burst.firstBytes, 0.5)), benchutil.Millis(p99), benchutil.Millis(p99)/benchutil.Millis(p50))
	burst.printSteps()
	return nil
}

// series is one run of creates timed to their first output, one after
// another.
type series struct {
	firstBytes []time.Duration
	// pooled are the phases of the creates a warm pool entry served.
	pooled []phases
	// bare are the bare `runc run`s timed each right before a create.
	bare []time.Duration
}

// firstOutputSeries times n creates to their first output, one after
// another, each settled as createToFirstByte says; with bare, each after
// one bare run of it.
func firstOutputSeries(ctx context.Context, c steps, home string, n int, settle time.Duration, bare *benchutil.BareBundle) (series, error) {
	var s series
	for range n {
		if bare != nil {
			d, err := bare.Run()
			if err != nil {
				return s, err
			}
			s.bare = append(s.bare, d)
		}
		p, pooled, err := createToFirstByte(ctx, c, home, settle)
		if err != nil {
			return s, err
		}
		s.firstBytes = append(s.firstBytes, p.firstByte)
		if pooled {
			s.pooled = append(s.pooled, p)
		}
	}
	return s, nil
}

// concurrentFirstOutputs times n creates started at once to their first
// outputs.
func concurrentFirstOutputs(ctx context.Context, c steps, home string, n int) (series, error) {
	all := make([]phases, n)
	pooled := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { all[i], pooled[i], errs[i] = createToFirstByte(ctx, c, home, 0) })
	}
	wg.Wait()
	var s series
	for i, p := range all {
		s.firstBytes = append(s.firstBytes, p.firstByte)
		if pooled[i] {
			s.pooled = append(s.pooled, p)
		}
	}
	return s, errors.Join(errs...)
}

// print prints the series' p50 and p99 beside the bare runs', and the p50
// of each step of its pooled creates.
func (s series) print(name string, bare []time.Duration) {
	fmt.Printf("  %s (%d of %d from the warm pool):\n", name, len(s.pooled), len(s.firstBytes))
	for _, q := range []float64{0.5, 0.99} {
		got, base := benchutil.Quantile(s.firstBytes, q), benchutil.Quantile(bare, q)
		fmt.Printf("    p%02.0f %6.1f ms  bare runc run p%02.0f %6.1f ms  ratio %.2f\n",
			q*100, benchutil.Millis(got), q*100, benchutil.Millis(base), benchutil.Millis(got)/benchutil.Millis(base))
	}
	if len(s.bare) == len(s.firstBytes) && len(s.bare) > 0 {
		ratios := make([]float64, len(s.bare))
		for i, b := range s.bare {
			ratios[i] = float64(s.firstBytes[i]) / float64(b)
		}
		slices.Sort(ratios)
		fmt.Printf("    each create over the bare run right before it: p50 ratio %.2f\n", ratios[len(ratios)/2])
	}
	s.printSteps()
}

// printSteps prints the p50 of each step of the series' pooled creates.
func (s series) printSteps() {
	if len(s.pooled) == 0 {
		return
	}
	step := func(f func(phases) time.Duration) float64 {
		var d []time.Duration
		for _, p := range s.pooled {
			d = append(d, f(p))
		}
		return benchutil.Millis(benchutil.Quantile(d, 0.5))
	}
	fmt.Printf("    from the warm pool, p50 of each step: create answered %.1f ms, AVAILABLE seen +%.1f, session issued +%.1f, first byte +%.1f\n",
		step(func(p phases) time.Duration { return p.created }),
		step(func(p phases) time.Duration { return p.available - p.created }),
		step(func(p phases) time.Duration { return p.session - p.available }),
		step(func(p phases) time.Duration { return p.firstByte - p.session }))
	if s.pooled[0].nextExec > 0 {
		fmt.Printf("    a second echo ready in the same workspace, to its first byte: p50 %.1f ms\n",
			step(func(p phases) time.Duration { return p.nextExec }))
	}
}
