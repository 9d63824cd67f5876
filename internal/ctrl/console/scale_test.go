package console_test

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// ScaleEnv, set to a number of workspaces, runs TestConsoleScale.
const ScaleEnv = "KIBOTOS_CONSOLE_SCALE"

// TestConsoleScale measures the workspace list of the console holding
// many workspaces (KIBOTOS_CONSOLE_SCALE of them, e.g. 1000): how long
// the page takes from its load to the first page of rows shown, and to
// the next page, the main thread's time
// per refresh while the list stays open, the JavaScript heap and the
// DOM's size, and how long a label filter takes. It logs the figures and
// asserts none of them. The control plane is the real one in-process on
// SQLite, with a registered host that runs nothing, so the workspaces
// stay CREATING: what the list shows of each is the same.
func TestConsoleScale(t *testing.T) {
	var n int
	if _, err := fmt.Sscan(os.Getenv(ScaleEnv), &n); err != nil || n <= 0 {
		t.Skipf("set %s to a number of workspaces to measure the console with", ScaleEnv)
	}
	requireBundle(t)
	s := ctrltest.Start(t)
	s.RegisterHost(t, "h1")
	s.AddBuiltinTemplate(t)
	wss := ctrlv1connect.NewWorkspaceServiceClient(s.HTTP, s.URL, connect.WithInterceptors(bearer.Token(s.AdminToken)))
	start := time.Now()
	var wg sync.WaitGroup
	jobs := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				if _, err := wss.CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
					Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
					Spec:    &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 10, MemoryBytes: 128 << 20}},
					Labels:  map[string]string{"team": fmt.Sprintf("t%d", i%100), "bench": "console"},
				})); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d workspaces created in %v", n, time.Since(start).Round(time.Millisecond))

	b := newPage(t)
	b.signIn(s.URL, s.AdminToken, "admin")
	rows := `document.querySelectorAll("table.list tbody tr").length`
	page := min(n, 100) // the list's page
	// From a fresh load (the token stays in session storage): the page's
	// own clock at the first poll that sees the first page's rows (polled
	// on every animation frame).
	b.do(chromedp.Reload())
	shown, err := chromedp.Run(b.ctx, chromedp.Poll[float64](fmt.Sprintf(`%s === %d ? performance.now() : 0`, rows, page),
		chromedp.WithPollingTimeout(5*time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	b.screenshot("scale")
	// What of that was the list's call: request to last byte.
	list, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]float64](`performance.getEntriesByType("resource")
		.filter(e => e.name.endsWith("/ListWorkspaces")).map(e => [e.startTime, e.responseEnd - e.startTime, e.transferSize]).flat()`))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+2 < len(list); i += 3 {
		t.Logf("ListWorkspaces at %.0f ms: %.0f ms, %.0f bytes", list[i], list[i+1], list[i+2])
	}
	if _, err := chromedp.Call(b.ctx, performance.Enable, performance.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	metrics := func() map[string]float64 {
		t.Helper()
		r, err := chromedp.Call(b.ctx, performance.GetMetrics, cdp.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, m := range r.Metrics {
			out[m.Name] = m.Value
		}
		return out
	}
	const window = 20 * time.Second // ten refreshes, two seconds apart
	before := metrics()
	time.Sleep(window)
	after := metrics()
	busy := func(name string) float64 { return (after[name] - before[name]) * 1000 / (window.Seconds() / 2) }
	t.Logf("%d workspaces: the first page's %d rows shown %.0f ms after the page's load began", n, page, shown)
	t.Logf("per refresh (every 2 s): script %.1f ms, layout %.1f ms, style %.1f ms, all tasks %.1f ms of the main thread",
		busy("ScriptDuration"), busy("LayoutDuration"), busy("RecalcStyleDuration"), busy("TaskDuration"))
	t.Logf("JS heap used %.1f MiB (of %.1f MiB), %.0f DOM nodes, %.0f layout objects",
		after["JSHeapUsedSize"]/(1<<20), after["JSHeapTotalSize"]/(1<<20), after["Nodes"], after["LayoutObjects"])

	// The next page.
	if n > page {
		next, err := chromedp.Run(b.ctx, chromedp.Evaluate[float64](`window.__t0 = performance.now();
			document.getElementById("ws-next").click(); window.__t0`))
		if err != nil {
			t.Fatal(err)
		}
		at, err := chromedp.Run(b.ctx, chromedp.Poll[float64](fmt.Sprintf(
			`document.getElementById("ws-status").textContent.startsWith("workspaces %d to") ? performance.now() : 0`, page+1),
			chromedp.WithPollingTimeout(time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the next page shown %.0f ms after the click", at-next)
	}

	// A label filter that keeps 1% of the list.
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`window.__t0 = performance.now();
		const f = document.getElementById("ws-filter"); f.value = "team=t7"; f.dispatchEvent(new Event("change")); true`)); err != nil {
		t.Fatal(err)
	}
	want := 0
	for i := range n {
		if i%100 == 7 {
			want++
		}
	}
	filtered, err := chromedp.Run(b.ctx, chromedp.Poll[float64](fmt.Sprintf(`%s === %d ? performance.now() - window.__t0 : 0`, rows, want),
		chromedp.WithPollingTimeout(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("filter team=t7: %d rows shown %.0f ms after the change", want, filtered)
}
