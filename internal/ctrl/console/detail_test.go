package console_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kibotos/kibotos/internal/ctrl/console"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
)

// TestConsoleMissingWorkspace opens the files of a workspace that does
// not exist (another project's, or a pruned one): the page says not_found
// once and stops, instead of watching and waiting for it for ever.
func TestConsoleMissingWorkspace(t *testing.T) {
	if !console.New().Built() {
		t.Skip("the console's bundle is not built: run make build (npm ci and the bundle in console/)")
	}
	d := uptest.Shared(t)
	token := d.Project(t)
	b := newPage(t)
	b.signIn(d.URL, token, "admin")
	const id = "ws_000000000000000000000000zz"
	b.do(chromedp.Navigate(d.URL + "/#/workspaces/" + id + "/files"))
	b.wait("not_found", `document.getElementById("ws-error")?.textContent.startsWith("not_found")`)
	// calls counts the page's calls that watch or read the workspace.
	calls := func() int {
		t.Helper()
		n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](
			`performance.getEntriesByType("resource").filter(e => /WorkspaceService\/(WatchWorkspace|GetWorkspace)$/.test(e.name)).length`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := calls()
	time.Sleep(5 * time.Second) // more than two rounds of the watch's retry
	b.screenshot("missing-workspace")
	if after := calls(); after != before {
		t.Errorf("the page called WatchWorkspace or GetWorkspace %d more times in 5 s after not_found", after-before)
	}
	if body := b.text("#tab-files"); !strings.HasPrefix(body, "The workspace cannot be opened: not_found") {
		t.Errorf("the files tab reads %q, want why the workspace cannot be opened", body)
	}
}
