package console_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/sdk"
)

// fileRow is a JavaScript expression for the row of the file browser whose
// name cell reads name.
func fileRow(name string) string {
	return fmt.Sprintf(`[...document.querySelectorAll("table[aria-label=Files] tbody tr")].find(tr => tr.cells[0].textContent === %s)`, js(name))
}

// TestConsoleFileNames lists names the console must keep apart: two that
// an element ID would make one ("a b" and "a_b"), each with a Rename form
// of its own that warns next to itself before it replaces a file, and
// names with a right-to-left override, which would show as other names
// (secret.txt) were their controls not escaped and isolated.
func TestConsoleFileNames(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	token := d.Project(t)
	ctx := t.Context()
	ws, err := sdk.New(d.URL, token).CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	const dir = "/tmp/names"
	files := map[string]string{"a b": "precious", "a_b": "other", "secret.txt": "public",
		"\u202Etxt.terces": "private", "\u202Egpj.exe": "program",
		// Ordinary names that need format characters, and one that hides one.
		"fam\U0001F468\u200D\U0001F469\u200D\U0001F467.txt": "emoji", "\u0645\u06CC\u200C\u062E\u0648\u0627\u0645.txt": "persian",
		"scot\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F.txt": "flag", "a\u200Db": "hidden"}
	if err := ws.MkdirAll(ctx, dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := ws.WriteFile(ctx, dir+"/"+name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ws.Exec(ctx, []string{"ln", "-s", "\u202Etxt.terces", dir + "/link"}, sdk.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		t.Helper()
		got, err := ws.ReadFile(ctx, dir+"/"+name)
		if err != nil {
			t.Fatalf("reading %s: %v", name, err)
		}
		return string(got)
	}
	b := newPage(t)
	b.signIn(d.URL, token, "admin")
	b.do(chromedp.Navigate(d.URL+"/#/workspaces/"+ws.ID()+"/files"), chromedp.WaitVisible(chromedp.CSS("#files-dir")))
	// The page opens /tmp first: a listing of it that came after the one
	// asked for would take the table back.
	b.wait("/tmp listed", `document.querySelector("table[aria-label=Files] caption")?.textContent === "Contents of /tmp"`)
	b.do(chromedp.SetValue(chromedp.CSS("#files-dir"), dir), chromedp.Click(chromedp.CSS(`form[aria-label=Directory] button[type=submit]`)))
	b.wait("the files listed", `!!`+fileRow("a b")+` && !!`+fileRow("a_b"))
	b.screenshot("names")

	// Each name shows as what it is, its controls escaped and in a <bdi>
	// of its own; no bidi control reaches the text or the labels.
	names, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("table[aria-label=Files] tbody tr")].map(tr => tr.cells[0].textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"secret.txt", `\u202Etxt.terces`, `\u202Egpj.exe`, `link → \u202Etxt.terces`,
		"fam\U0001F468\u200D\U0001F469\u200D\U0001F467.txt", "\u0645\u06CC\u200C\u062E\u0648\u0627\u0645.txt",
		"scot\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F.txt", `a\u200Db`} {
		if !slices.Contains(names, want) {
			t.Errorf("the names listed are %q: no %q", names, want)
		}
	}
	controls, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](`{
		const table = document.querySelector("table[aria-label=Files]");
		[table.textContent, ...[...table.querySelectorAll("[aria-label]")].map(e => e.getAttribute("aria-label"))]
			.filter(s => /[\u202A-\u202E\u2066-\u2069]/.test(s)) }`))
	if err != nil {
		t.Fatal(err)
	}
	if len(controls) > 0 {
		t.Errorf("bidi controls in the file list's text or labels: %q", controls)
	}
	if n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](
		`[...document.querySelectorAll("table[aria-label=Files] tbody td:first-child")].filter(td => !td.querySelector("bdi")).length`)); err != nil || n != 0 {
		t.Errorf("%d names are not isolated in a <bdi> (%v)", n, err)
	}

	// Rename forms open on both rows; the one of a_b asks for a b, which
	// is taken: the warning is next to that form, not under a b's, and a
	// b keeps its content until Save is pressed there again.
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Rename a b"]`)), chromedp.Click(chromedp.CSS(`button[aria-label="Rename a_b"]`)))
	// submit presses Save in the Rename form of row, with the name set to
	// value unless it is empty.
	submit := func(row, value string) {
		t.Helper()
		set := ""
		if value != "" {
			set = fmt.Sprintf(`f.querySelector("input").value = %s;`, js(value))
		}
		if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](fmt.Sprintf(
			`{ const f = %s.querySelector("form"); %s f.requestSubmit(); true }`, fileRow(row), set))); err != nil {
			t.Fatal(err)
		}
	}
	submit("a_b", "a b")
	warnings := `[...document.querySelectorAll("table[aria-label=Files] tbody tr")].filter(tr => tr.querySelector("form .field-error")?.textContent.includes("press Save again")).map(tr => tr.cells[0].textContent)`
	b.wait("the warning", warnings+`.length > 0`)
	b.screenshot("rename-warning")
	if got, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](warnings)); err != nil || len(got) != 1 || got[0] != "a_b" {
		t.Fatalf("the rows that warn of a b being replaced: %q (%v), want only a_b's, whose form was submitted", got, err)
	}
	if got := read("a b"); got != "precious" {
		t.Fatalf("a b holds %q before the second Save, want precious", got)
	}
	submit("a_b", "")
	b.wait("a_b renamed", `!`+fileRow("a_b"))
	if got := read("a b"); got != "other" {
		t.Errorf("after the second Save a b holds %q, want a_b's content", got)
	}
	if !strings.Contains(b.text("table[aria-label=Files] tbody"), "a b") {
		t.Errorf("a b is not listed after the rename")
	}

	// A message that names a file names it escaped: an override would
	// turn the rest of the message around.
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Rename secret.txt"]`)))
	submit("secret.txt", "\u202Etxt.terces")
	b.wait("the warning", fileRow("secret.txt")+`?.querySelector("form .field-error")?.textContent !== ""`)
	if got, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](fileRow("secret.txt")+`.querySelector("form .field-error").textContent`)); err != nil ||
		got != `\u202Etxt.terces exists: press Save again to replace it` {
		t.Errorf("the warning of a rename onto \\u202Etxt.terces reads %q (%v)", got, err)
	}
}
