package console_test

import (
	"fmt"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestConsoleResourceActions checks the rows' actions on the resources
// page: each button names its object ("Delete template mine", "Revoke
// token tok_..."), the built-in template base is offered for a change only
// to an admin of the operator project (anyone else's is refused), and a
// token's name shows its bidi controls escaped.
func TestConsoleResourceActions(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	token := d.Project(t)
	ctx := t.Context()
	opt := connect.WithInterceptors(bearer.Token(token))
	templates := ctrlv1connect.NewTemplateServiceClient(http.DefaultClient, d.URL, opt)
	if _, err := templates.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, TemplateId: "mine"})); err != nil {
		t.Fatal(err)
	}
	vol, err := sdk.New(d.URL, token).CreateVolume(ctx, sdk.VolumeOptions{CapacityBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	admin := adminv1connect.NewAdminServiceClient(http.DefaultClient, d.URL, opt)
	tok, err := admin.CreateToken(ctx, connect.NewRequest(&adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_VIEWER, Name: "\u202Enimda"}))
	if err != nil {
		t.Fatal(err)
	}
	tokenID := tok.Msg.GetToken().GetTokenId()
	b := newPage(t)
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	b.signIn(d.URL, token, "admin")
	b.do(chromedp.Navigate(d.URL + "/#/resources"))
	b.wait("the lists", `document.querySelectorAll("table[aria-label=Templates] tbody tr, table[aria-label=Volumes] tbody tr, table[aria-label=Tokens] tbody tr").length >= 5`)
	b.screenshot("resources")
	for _, label := range []string{"Delete template mine", "Delete volume " + vol.GetVolumeId(), "Revoke token " + tokenID} {
		if n := count(fmt.Sprintf(`button[aria-label=%q]`, label)); n != 1 {
			t.Errorf("%d buttons named %q", n, label)
		}
	}
	labels, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("button.danger")].map(b => b.getAttribute("aria-label"))`))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range labels {
		if seen[l] {
			t.Errorf("two buttons are named %q; all: %q", l, labels)
		}
		seen[l] = true
	}
	if t.Failed() {
		t.FailNow() // the buttons pressed below are not there
	}
	// base is built in: a project admin that is not the operator's may
	// not change it, and is not offered to.
	if n := count(`button[aria-label="Delete template base"]`); n != 0 {
		t.Errorf("a project admin is offered to delete the built-in template base")
	}
	if !containsCell(t, b, "Tokens", `\u202Enimda`) {
		t.Errorf("the token named U+202E nimda is not shown escaped: %q", b.text(`table[aria-label=Tokens] tbody`))
	}
	// A delete names its template in its confirmation too, and deletes it.
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Delete template mine"]`)),
		chromedp.Click(chromedp.CSS(`button[aria-label="Confirm delete template mine"]`)))
	b.wait("mine gone", `![...document.querySelectorAll("table[aria-label=Templates] tbody td:first-child")].some(td => td.textContent === "mine")`)
	if _, err := templates.GetTemplate(ctx, connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: "mine"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("reading the deleted template: %v", err)
	}

	// The operator project's admin may change base, and is offered to.
	b.do(chromedp.Click(chromedp.CSS(`#who button`)), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.signIn(d.URL, d.AdminToken, "admin")
	b.do(chromedp.Navigate(d.URL + "/#/resources"))
	b.wait("base listed", `[...document.querySelectorAll("table[aria-label=Templates] tbody td:first-child")].some(td => td.textContent === "base")`)
	if n := count(`button[aria-label="Delete template base"]`); n != 1 {
		t.Errorf("the operator project's admin is offered %d deletes of base, want 1", n)
	}
}

// containsCell reports whether a cell of the table labelled table reads
// text.
func containsCell(t *testing.T, b *page, table, text string) bool {
	t.Helper()
	ok, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](fmt.Sprintf(
		`[...document.querySelectorAll("table[aria-label=%s] td")].some(td => td.textContent === %s)`, table, js(text))))
	if err != nil {
		t.Fatal(err)
	}
	return ok
}
