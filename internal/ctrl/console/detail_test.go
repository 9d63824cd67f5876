package console_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestConsoleMissingWorkspace opens the files of a workspace that does
// not exist (another project's, or a pruned one): the page says not_found
// once and stops, instead of watching and waiting for it for ever.
func TestConsoleMissingWorkspace(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	token := d.Project(t)
	b := newPage(t)
	b.signIn(d.URL, token, "admin")
	const id = "ws_000000000000000000000000zz"
	b.do(chromedp.Navigate(d.URL + "/#/workspaces/" + id + "/files"))
	b.wait("not_found", `document.getElementById("ws-error")?.textContent.startsWith("not_found")`)
	quiet(t, workspaceCalls(b), "after not_found")
	b.screenshot("missing-workspace")
	if body := b.text("#tab-files"); !strings.HasPrefix(body, "The workspace cannot be opened: not_found") {
		t.Errorf("the files tab reads %q, want why the workspace cannot be opened", body)
	}
}

// quiet checks that calls counts no more calls over 5 s, more than two
// rounds of the watch's retry.
func quiet(t *testing.T, calls func() int, when string) {
	t.Helper()
	before := calls()
	time.Sleep(5 * time.Second)
	if after := calls(); after != before {
		t.Errorf("the page called WatchWorkspace or GetWorkspace %d more times in 5 s %s", after-before, when)
	}
}

// workspaceCalls counts the page's calls that watch or read a workspace.
func workspaceCalls(b *page) func() int {
	return func() int {
		b.t.Helper()
		n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](
			`performance.getEntriesByType("resource").filter(e => /WorkspaceService\/(WatchWorkspace|GetWorkspace)$/.test(e.name)).length`))
		if err != nil {
			b.t.Fatal(err)
		}
		return n
	}
}

// TestConsoleWorkspaceEnds: a workspace deleted while its page is open
// ends the page's watch, which says so; a token revoked while a
// workspace's page watches takes the page back to the sign-in form.
func TestConsoleWorkspaceEnds(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	token := d.Project(t)
	ctx := t.Context()
	c := sdk.New(d.URL, token)
	defer c.Close()
	ws, err := c.CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	b := newPage(t)
	b.signIn(d.URL, token, "admin")
	b.do(chromedp.Navigate(d.URL + "/#/workspaces/" + ws.ID() + "/files"))
	b.wait("the files tab", `document.querySelector("#tab-files table") !== null`)
	if err := c.DeleteWorkspace(ctx, ws.ID()); err != nil {
		t.Fatal(err)
	}
	b.wait("the page saying it was deleted", `document.getElementById("ws-error")?.textContent.includes("was deleted")`)
	quiet(t, workspaceCalls(b), "after the workspace was deleted")
	b.screenshot("workspace-deleted")

	admin := adminv1connect.NewAdminServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(token)))
	editor, err := admin.CreateToken(ctx, connect.NewRequest(&adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_EDITOR, Name: "watching"}))
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteWorkspace(ctx, other.ID())
	b.do(chromedp.Click(chromedp.CSS(`#who button`)), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.signIn(d.URL, editor.Msg.GetSecret(), "editor")
	b.do(chromedp.Navigate(d.URL + "/#/workspaces/" + other.ID() + "/overview"))
	b.wait("the overview", `document.getElementById("ws-state")?.textContent.includes("AVAILABLE")`)
	if _, err := admin.RevokeToken(ctx, connect.NewRequest(&adminv1.RevokeTokenRequest{TokenId: editor.Msg.GetToken().GetTokenId()})); err != nil {
		t.Fatal(err)
	}
	b.wait("the sign-in form again", `document.getElementById("signin-notice")?.textContent.includes("sign in again") && document.getElementById("who").textContent === ""`)
}
